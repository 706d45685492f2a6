"""A checkpoint's adapter files read back exactly, and refused with `CheckpointError` when torn, foreign or not
finite, before anything changes (the resume and fault tests run the whole trainer over them)."""

from types import SimpleNamespace

import pytest
import torch

from agentrl.backend.training.adapters.adapter_files import (
    read_adapter_weights,
    read_optimizer_state,
    write_adapter_files,
)
from agentrl.foundation.errors import CheckpointError
from agentrl.records.checkpoints import ADAPTER_FILE, OPTIMIZER_FILE


class _PeftConfig(SimpleNamespace):
    """peft's config as the writer uses it: a flag it sets for vLLM while saving, and a save."""

    def save_pretrained(self, folder: str) -> None:
        self.saved_inference_mode = self.inference_mode


def _written(tmp_path):
    parameter = torch.nn.Parameter(torch.randn(4, 2))
    optimizer = torch.optim.AdamW([parameter])
    parameter.grad = torch.ones_like(parameter)
    optimizer.step()
    config = _PeftConfig(inference_mode=False)
    write_adapter_files(tmp_path, {"lora_A": parameter.detach()}, config, optimizer.state_dict())
    return parameter, config


def test_adapter_files_read_back_exactly_and_are_marked_for_inference_only_on_disk(tmp_path):
    parameter, config = _written(tmp_path)
    weights = read_adapter_weights(tmp_path, {"lora_A": (4, 2)})
    assert torch.equal(weights["lora_A"], parameter.detach())
    assert config.saved_inference_mode is True and config.inference_mode is False
    state = read_optimizer_state(tmp_path, [parameter])
    assert state["state"][0]["exp_avg"].shape == parameter.shape


def test_torn_foreign_or_non_finite_adapter_files_are_refused(tmp_path):
    parameter, _ = _written(tmp_path)
    with pytest.raises(CheckpointError, match="does not fit this model's LoRA"):
        read_adapter_weights(tmp_path, {"lora_A": (2, 4)})
    with pytest.raises(CheckpointError, match="not for this model's 2 tensors"):
        read_optimizer_state(tmp_path, [parameter, parameter])
    with pytest.raises(CheckpointError, match="shaped unlike"):
        read_optimizer_state(tmp_path, [torch.nn.Parameter(torch.zeros(2, 4))])
    (tmp_path / OPTIMIZER_FILE).write_bytes(b"torn")
    with pytest.raises(CheckpointError, match="cannot read the optimizer state"):
        read_optimizer_state(tmp_path, [parameter])
    write_adapter_files(tmp_path, {"lora_A": torch.full((4, 2), float("nan"))}, _PeftConfig(inference_mode=False), {})
    with pytest.raises(CheckpointError, match="non-finite"):
        read_adapter_weights(tmp_path, {"lora_A": (4, 2)})
    (tmp_path / ADAPTER_FILE).write_bytes((tmp_path / ADAPTER_FILE).read_bytes()[:20])
    with pytest.raises(CheckpointError, match="cannot read the adapter"):
        read_adapter_weights(tmp_path, {"lora_A": (4, 2)})
