"""An adapter's state in the live peft model, to and from its checkpoint files (`adapter_files`).

Sharded ranks gather whole tensors to save and keep their own shard of what they load, so a
checkpoint is the same file whatever the number of ranks that wrote or reads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from agentrl.backend.training.adapters.adapter_files import (
    read_adapter_weights,
    read_optimizer_state,
    write_adapter_files,
)
from agentrl.backend.training.step import sharding
from agentrl.backend.training.step.gradients import Adapter


def whole_weights(model: Any, name: str) -> dict[str, torch.Tensor]:
    """A copy of adapter `name`'s whole weights on the CPU, keyed as in its checkpoint (peft's names).
    Sharded, the shards are gathered: every rank must call it."""
    from peft import get_peft_model_state_dict

    weights = get_peft_model_state_dict(model, adapter_name=name)
    return {k: sharding.whole(v.detach()).cpu().clone() for k, v in weights.items()}


def parameters_by_key(model: Any, name: str) -> dict[str, torch.nn.Parameter]:
    """Adapter `name`'s parameters under their checkpoint keys (peft drops the adapter's name)."""
    marker = f".{name}."
    return {n.replace(marker, ".", 1): p for n, p in model.named_parameters() if "lora_" in n and marker in n}


def save_adapter(model: Any, name: str, adapter: Adapter, folder: Path, *, sharded: bool, writes: bool) -> None:
    """Write adapter `name` (peft's format, which vLLM loads) and its optimizer state into `folder`
    (where `writes`: sharded, every rank gathers and one writes)."""
    weights = whole_weights(model, name)
    optimizer_state = adapter.optimizer.state_dict()
    if sharded:
        optimizer_state = sharding.whole_optimizer_state(optimizer_state)
    if writes:
        write_adapter_files(folder, weights, model.peft_config[name], optimizer_state)


def load_adapter(model: Any, name: str, adapter: Adapter, folder: Path, *, sharded: bool) -> None:
    """Restore what `save_adapter` wrote, after checking both files: a missing, unreadable, misshapen or
    non-finite one raises `CheckpointError` and changes nothing."""
    from peft import get_peft_model_state_dict, set_peft_model_state_dict

    expected = {k: tuple(v.shape) for k, v in get_peft_model_state_dict(model, adapter_name=name).items()}
    weights = read_adapter_weights(folder, expected)
    optimizer_state = read_optimizer_state(folder, adapter.parameters)
    if sharded:  # each rank keeps its shard of the whole tensors it read
        sharding.load_shards(weights, parameters_by_key(model, name), optimizer_state, adapter.parameters)
    else:
        set_peft_model_state_dict(model, weights, adapter_name=name)
    adapter.optimizer.load_state_dict(optimizer_state)
