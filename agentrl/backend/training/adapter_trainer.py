"""What a backend asks of its trainer (`AdapterTrainer`), what a step returns, and the SFT loop over it.

Torch-free, so the backend's step logic type-checks and imports without loading a model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from tqdm.auto import tqdm

from agentrl.rl.ledger import StepCounts

if TYPE_CHECKING:
    import torch

    from agentrl.backend.training.step_input import TrainingConditions
    from agentrl.data.trajectory import History
    from agentrl.data.trajectory_group import TrajectoryGroup
    from agentrl.foundation.config import LoRAConfig, SFTConfig, TrainConfig
    from agentrl.rl.tokenize import TokenizedSequence


@dataclass(frozen=True)
class StepOutcome:
    """What a training step did: whether it updated the weights, its metrics, (a step that updated) the
    conditions a bit-exact replay of it needs, and (a GRPO step) what it counted."""

    updated: bool
    metrics: dict[str, float] = field(default_factory=dict)
    conditions: TrainingConditions | None = None
    counts: StepCounts = field(default_factory=StepCounts)


class AdapterTrainer(Protocol):
    """A frozen base with one LoRA adapter per model: `Trainer` in this process, or `TrainerRanks` over several."""

    def add_adapter(self, name: str, lora: LoRAConfig) -> None: ...
    def load(self, name: str, folder: Path) -> None: ...
    def save(self, name: str, folder: Path) -> None: ...
    def train_step(self, name: str, groups: Sequence[TrajectoryGroup], config: TrainConfig) -> StepOutcome: ...
    def sft_step(
        self,
        name: str,
        histories: Sequence[History],
        *,
        learning_rate: float,
        micro_batch_tokens: int | None,
        shared_prefix: bool | None = None,
        assistant_turns: str = "all",
    ) -> StepOutcome: ...
    def logprobs_of(self, name: str, sequences: Sequence[TokenizedSequence]) -> list[list[float]]: ...
    def adapter_weights(self, name: str, rank: int | None = ...) -> dict[str, torch.Tensor]: ...
    def parameter_bytes(self) -> list[int]: ...
    def close(self) -> None: ...


def train_sft(
    trainer: AdapterTrainer,
    name: str,
    histories: Sequence[History],
    config: SFTConfig,
    *,
    batch_micro_batch_tokens: Sequence[int] | None = None,
) -> StepOutcome:
    """`config.epochs` passes of supervised steps of `config.batch_size` demonstrations over adapter `name`,
    with a progress bar; the outcome carries the last step's metrics and conditions (no update if no step
    trained), with every batch's micro-batch size in order (`batch_micro_batch_tokens`: a GPU that ran
    out of memory mid-call halved it from that batch on). Given those sizes, each batch runs at its own
    (a replay of the call)."""
    metrics: dict[str, float] = {}
    conditions: TrainingConditions | None = None
    sizes: list[int] = []
    starts = range(0, len(histories), config.batch_size)
    with tqdm(total=config.epochs * len(starts), desc="sft", unit="batch") as progress:
        for epoch in range(config.epochs):
            for start in starts:
                outcome = trainer.sft_step(
                    name,
                    histories[start : start + config.batch_size],
                    learning_rate=config.learning_rate,
                    micro_batch_tokens=(
                        batch_micro_batch_tokens[len(sizes)] if batch_micro_batch_tokens else config.micro_batch_tokens
                    ),
                    shared_prefix=config.shared_prefix,
                    assistant_turns=config.assistant_turns,
                )
                if outcome.updated:
                    metrics, conditions = {**outcome.metrics, "epoch": float(epoch)}, outcome.conditions
                sizes.append(outcome.conditions.micro_batch_tokens if outcome.conditions is not None else 0)
                progress.set_postfix(loss=f"{metrics.get('sft_loss', float('nan')):.3f}", refresh=False)
                progress.update(1)
    if conditions is None:
        return StepOutcome(False, metrics)
    return StepOutcome(True, metrics, dataclasses.replace(conditions, batch_micro_batch_tokens=tuple(sizes)))
