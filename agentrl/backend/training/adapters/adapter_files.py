"""A trained adapter's files in a checkpoint folder: peft's format (which vLLM loads) and AdamW's state.

- `adapter_model.safetensors` and `adapter_config.json`: the LoRA weights and peft's config (its base model);
- `optimizer.pt`: the optimizer's state, so a resumed run takes the step it would have taken.

Reading checks before anything changes: a missing, torn or foreign file raises `CheckpointError`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from agentrl.foundation.errors import CheckpointError
from agentrl.records.checkpoints import ADAPTER_FILE, OPTIMIZER_FILE


def write_adapter_files(
    folder: Path, weights: dict[str, torch.Tensor], peft_config: Any, optimizer_state: dict[str, Any]
) -> None:
    """Write the weights, peft's config (marked for inference, as vLLM wants it) and the optimizer state."""
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in weights.items()}, folder / ADAPTER_FILE)
    inference_mode, peft_config.inference_mode = peft_config.inference_mode, True
    try:
        peft_config.save_pretrained(str(folder))
    finally:
        peft_config.inference_mode = inference_mode
    torch.save(optimizer_state, folder / OPTIMIZER_FILE)


def read_adapter_weights(folder: Path, expected_shapes: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """The adapter's weights, checked to be finite and shaped as `expected_shapes` (this model's LoRA)."""
    from safetensors.torch import load_file

    path = folder / ADAPTER_FILE
    try:
        weights = load_file(path)
    except Exception as error:  # noqa: BLE001 - safetensors raises its own and OS errors alike
        raise CheckpointError(f"cannot read the adapter {path}: {type(error).__name__}: {error}") from error
    found = {k: tuple(v.shape) for k, v in weights.items()}
    if found != expected_shapes:
        differing = sorted(set(found) ^ set(expected_shapes)) or [
            k for k in expected_shapes if found[k] != expected_shapes[k]
        ]
        raise CheckpointError(
            f"the adapter {path} does not fit this model's LoRA (rank and target modules): {differing[:3]} differ"
        )
    if not all(torch.isfinite(v).all() for v in weights.values()):
        raise CheckpointError(f"the adapter {path} holds non-finite weights")
    return weights


def read_optimizer_state(folder: Path, parameters: list[torch.nn.Parameter]) -> dict[str, Any]:
    """AdamW's saved state, checked to be for `parameters` (their number and shapes)."""
    path = folder / OPTIMIZER_FILE
    try:
        state = torch.load(path, weights_only=True)
    except Exception as error:  # noqa: BLE001 - a missing file, a torn pickle, or a foreign object
        raise CheckpointError(f"cannot read the optimizer state {path}: {type(error).__name__}: {error}") from error
    groups = state.get("param_groups") if isinstance(state, dict) else None
    if not groups or sum(len(g["params"]) for g in groups) != len(parameters):
        raise CheckpointError(f"the optimizer state {path} is not for this model's {len(parameters)} tensors")
    for index, parameter in enumerate(parameters):
        moments = state["state"].get(index, {})
        if any(k in moments and moments[k].shape != parameter.shape for k in ("exp_avg", "exp_avg_sq")):
            raise CheckpointError(f"the optimizer state {path} is shaped unlike this model's adapter")
    return dict(state)
