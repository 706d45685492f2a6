"""Train a recorded step again and compare it with its checkpoint: `agentrl replay RUN --step K`.

Checkpoint K-1 is loaded into a fresh trainer, step K's recorded input (`step_input`) is trained under
its recorded micro-batch size and thread count, and the adapter and optimizer state that come out are
compared, tensor by tensor, with checkpoint K. Under the same conditions (`training_conditions`: same
threads, number format, device, torch and one rank) the bytes are the same; elsewhere the report names
the conditions that differ and the largest difference.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from agentrl.backend.checkpoints import CheckpointStore
from agentrl.backend.training.adapter_files import ADAPTER_FILE, OPTIMIZER_FILE
from agentrl.backend.training.step_input import StepInput, read_step_input
from agentrl.config import LoRAConfig
from agentrl.errors import CheckpointError

REPLAY_ADAPTER = "replay"


@dataclass(frozen=True)
class ReplayReport:
    """Step K trained again against checkpoint K: the state's sha256 both ways, and where they differ."""

    step: int
    recorded_sha256: str
    replayed_sha256: str
    largest_difference: float
    """The largest absolute difference over every adapter weight and optimizer moment (0.0: equal values)."""
    largest_difference_in: str
    differing_conditions: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    """Condition: (recorded, here) where they differ; empty means a bit-exact repeat was expected."""

    @property
    def identical(self) -> bool:
        return self.recorded_sha256 == self.replayed_sha256


def state_tensors(weights: dict[str, torch.Tensor], optimizer_state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """An adapter's weights and its optimizer's per-tensor state, flat and named, in one order."""
    tensors = {f"weight {key}": value for key, value in sorted(weights.items())}
    for index, moments in sorted(optimizer_state["state"].items()):
        for name, value in sorted(moments.items()):
            tensors[f"optimizer {index} {name}"] = torch.as_tensor(value)
    return tensors


def state_sha256(tensors: dict[str, torch.Tensor]) -> str:
    """sha256 over the names, dtypes, shapes and raw bytes of `tensors`."""
    digest = hashlib.sha256()
    for name, tensor in tensors.items():
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{name}|{flat.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(flat.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def largest_difference(recorded: dict[str, torch.Tensor], replayed: dict[str, torch.Tensor]) -> tuple[float, str]:
    if recorded.keys() != replayed.keys():
        missing = sorted(recorded.keys() ^ replayed.keys())[:3]
        raise CheckpointError(f"the replayed state does not have the recorded state's tensors: {missing} differ")
    worst, where = 0.0, ""
    for name, tensor in recorded.items():
        gap = (
            float((tensor.double() - replayed[name].double().to(tensor.device)).abs().max()) if tensor.numel() else 0.0
        )
        if gap > worst or not where:
            worst, where = gap, name
    return worst, where


def replay_step(run_dir: Path, step: int, *, device: str | None = None) -> ReplayReport:
    """Train step `step` of the run in `run_dir` again from checkpoint `step - 1` and its recorded input,
    and compare with checkpoint `step`. `CheckpointError` names what is missing."""
    from safetensors.torch import load_file

    from agentrl.backend.training.trainer import Trainer

    store = CheckpointStore(run_dir)
    if step < 1:
        raise CheckpointError(f"step {step} cannot be replayed: a step is trained from the checkpoint before it")
    steps = store.steps()
    for needed in (step - 1, step):
        if needed not in steps:
            raise CheckpointError(
                f"checkpoint {needed} of {run_dir} is not there (it has {steps}): replaying step {step} needs "
                f"checkpoints {step - 1} and {step}; keep them with a larger retention (keep_last)"
            )
    recorded_input: StepInput = read_step_input(store.path(step))
    adapter = store.adapter_config(step)
    conditions = recorded_input.conditions
    threads = torch.get_num_threads()
    torch.set_num_threads(int(conditions.get("threads", threads)))  # how each matmul splits its sums
    try:
        trainer = Trainer(adapter["base_model_name_or_path"], device=device or conditions.get("device"))
        lora = LoRAConfig(
            rank=int(adapter["r"]),
            alpha=int(adapter["lora_alpha"]),
            dropout=float(adapter.get("lora_dropout") or 0.0),
            target_modules=tuple(sorted(adapter["target_modules"])),
        )
        trainer.add_adapter(REPLAY_ADAPTER, lora)
        trainer.load(REPLAY_ADAPTER, store.path(step - 1))
        trainer.micro_batch_tokens = int(conditions["micro_batch_tokens"])
        outcome = trainer.train_step(REPLAY_ADAPTER, recorded_input.groups, recorded_input.config)
        if not outcome.updated:
            raise CheckpointError(f"step {step}'s recorded input trained no update when replayed")
        here = outcome.conditions
        replayed = state_tensors(
            trainer.adapter_weights(REPLAY_ADAPTER), trainer.adapters[REPLAY_ADAPTER].optimizer.state_dict()
        )
    finally:
        torch.set_num_threads(threads)
    folder = store.path(step)
    recorded = state_tensors(load_file(folder / ADAPTER_FILE), torch.load(folder / OPTIMIZER_FILE, weights_only=True))
    worst, where = largest_difference(recorded, replayed)
    differing = {k: (v, here.get(k)) for k, v in conditions.items() if here.get(k) != v}
    return ReplayReport(step, state_sha256(recorded), state_sha256(replayed), worst, where, differing)
