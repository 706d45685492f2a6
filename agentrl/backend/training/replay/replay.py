"""Train a recorded step again and compare it with its checkpoint: `agentrl replay RUN --step K`.

Checkpoint K-1 is loaded into a fresh trainer, step K's recorded input (`step_input`: a GRPO step's
groups, or a `train_sft` call's demonstrations, every batch and epoch of it) is trained under its
recorded micro-batch size and thread count, on as many trainer ranks as trained it (each with its
share of the cores, as `TrainerRanks` deals them), and the adapter and optimizer state that come out
(as a checkpoint holds them) are compared, tensor by tensor, with checkpoint K. Under the same
conditions (`training_conditions`: threads, number format, device, torch, ranks, sharding) the bytes
are the same; elsewhere the report names the conditions that differ and the largest difference.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from agentrl.backend.training.adapter_trainer import train_sft
from agentrl.backend.training.step_input import (
    StepInput,
    TrainingConditions,
    read_step_input,
    use_deterministic_kernels,
)
from agentrl.foundation.config import LoRAConfig, SFTConfig, TrainConfig
from agentrl.foundation.errors import CheckpointError
from agentrl.records.checkpoints import ADAPTER_FILE, OPTIMIZER_FILE, CheckpointStore

if TYPE_CHECKING:
    from agentrl.backend.training.adapter_trainer import AdapterTrainer, StepOutcome

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


def checked_steps(store: CheckpointStore, first: int, last: int) -> list[StepInput]:
    """The recorded inputs of steps `first`..`last`, after checking that checkpoints `first - 1`..`last`
    are there; `CheckpointError` names what is missing."""
    if first < 1:
        raise CheckpointError(f"step {first} cannot be trained again: a step is trained from the checkpoint before it")
    steps = store.steps()
    for needed in range(first - 1, last + 1):
        if needed not in steps:
            raise CheckpointError(
                f"checkpoint {needed} of {store.root.parent} is not there (it has {steps}): training steps {first} to "
                f"{last} again needs checkpoints {first - 1} to {last}; keep them with a larger retention (keep_last)"
            )
    return [read_step_input(store.path(step)) for step in range(first, last + 1)]


def trainer_at(
    store: CheckpointStore, step: int, conditions: TrainingConditions, *, device: str | None
) -> AdapterTrainer:
    """A fresh trainer on the run's base model, placed as the recorded `conditions` say (its ranks, their
    sharding, deterministic kernels; `device`, else the recorded one), with adapter `REPLAY_ADAPTER` at
    checkpoint `step`. The caller closes it."""
    from agentrl.backend.training.placement import TrainerPlacement, start_trainer

    adapter = store.adapter_config(step)
    placement = TrainerPlacement(
        device=device or conditions.device,
        ranks=conditions.ranks,
        sharded=conditions.sharded,
        deterministic=conditions.deterministic,
    )
    trainer = start_trainer(adapter["base_model_name_or_path"], placement)
    lora = LoRAConfig(
        rank=int(adapter["r"]),
        alpha=int(adapter["lora_alpha"]),
        dropout=float(adapter.get("lora_dropout") or 0.0),
        target_modules=tuple(sorted(adapter["target_modules"])),
    )
    trainer.add_adapter(REPLAY_ADAPTER, lora)
    trainer.load(REPLAY_ADAPTER, store.path(step))
    return trainer


def train_recorded(
    trainer: AdapterTrainer, step_input: StepInput, config: TrainConfig | SFTConfig
) -> tuple[StepOutcome, TrainingConditions]:
    """One step of `REPLAY_ADAPTER` on a recorded input under `config`, with its recorded micro-batch size:
    a GRPO step, or (a supervised input) the whole `train_sft` call, each batch at its recorded size. Returns
    its outcome and the conditions it trained under; `CheckpointError` if it made no update."""
    config = config.model_copy(update={"micro_batch_tokens": step_input.conditions.micro_batch_tokens})
    if isinstance(config, SFTConfig):
        batch_sizes = step_input.conditions.batch_micro_batch_tokens  # None in checkpoints before 2026-11-28
        outcome = train_sft(
            trainer, REPLAY_ADAPTER, step_input.demonstrations, config, batch_micro_batch_tokens=batch_sizes
        )
    else:
        outcome = trainer.train_step(REPLAY_ADAPTER, step_input.groups, config)
    if outcome.conditions is None:  # set exactly when the step updated
        raise CheckpointError("a recorded step input trained no update when trained again")
    return outcome, outcome.conditions


@contextmanager
def recorded_conditions(conditions: TrainingConditions) -> Iterator[None]:
    """CPU threads (how each matmul splits its sums) and deterministic kernels as the recorded step had
    them, then as before."""
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(conditions.threads or threads)
    use_deterministic_kernels(conditions.deterministic)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        use_deterministic_kernels(deterministic)


def checkpoint_state(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return state_tensors(load_file(folder / ADAPTER_FILE), torch.load(folder / OPTIMIZER_FILE, weights_only=True))


def trainer_state(trainer: AdapterTrainer) -> dict[str, torch.Tensor]:
    """`REPLAY_ADAPTER`'s state as its checkpoint would hold it (with ranks, what rank 0 writes)."""
    with tempfile.TemporaryDirectory(prefix="agentrl-replay-") as folder:
        trainer.save(REPLAY_ADAPTER, Path(folder))
        return checkpoint_state(Path(folder))


def replay_step(run_dir: Path, step: int, *, device: str | None = None) -> ReplayReport:
    """Train step `step` of the run in `run_dir` again from checkpoint `step - 1` and its recorded input,
    and compare with checkpoint `step`. `CheckpointError` names what is missing."""
    store = CheckpointStore(run_dir)
    (recorded_input,) = checked_steps(store, step, step)
    conditions = recorded_input.conditions
    with recorded_conditions(conditions):
        trainer = trainer_at(store, step - 1, conditions, device=device)
        try:
            _, here = train_recorded(trainer, recorded_input, recorded_input.config)
            replayed = trainer_state(trainer)
        finally:
            trainer.close()
    recorded = checkpoint_state(store.path(step))
    worst, where = largest_difference(recorded, replayed)
    recorded_as, here_as = conditions.as_record(), here.as_record()
    differing = {k: (v, here_as.get(k)) for k, v in recorded_as.items() if here_as.get(k) != v}
    return ReplayReport(step, state_sha256(recorded), state_sha256(replayed), worst, where, differing)
