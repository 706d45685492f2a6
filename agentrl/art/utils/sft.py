"""ART's `art.utils.sft`: supervised training from a JSONL file of conversations."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import agentrl
from agentrl.data.trajectory import Trajectory
from agentrl.foundation.errors import ConfigurationError

from ..types import TrainSFTConfig


@dataclass(frozen=True)
class SFTDatasetChunk:
    """One chunk of an SFT epoch: its trajectories, the config to train them with, and where it sits."""

    trajectories: list[Trajectory]
    config: TrainSFTConfig
    step: int
    epoch: int
    epoch_step: int


def load_trajectories_from_file(file_path: str | Path) -> list[Trajectory]:
    """Each JSONL line {"messages": [...], "tools": [...]?} as a trajectory (assistant turns are what SFT learns)."""
    trajectories = []
    for number, line in enumerate(Path(file_path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            trajectories.append(Trajectory(messages_and_choices=row["messages"], tools=row.get("tools")))
        except (json.JSONDecodeError, KeyError, ValueError) as error:
            raise ConfigurationError(f'{file_path}:{number}: expected {{"messages": [...]}}: {error}') from error
    return trajectories


def create_sft_dataset_iterator(
    trajectories: Sequence[Trajectory],
    epochs: int = 1,
    batch_size: int = 1,
    chunk_size: int = 50,
    peak_lr: float = 2e-4,
    initial_step: int = 0,
    use_tqdm: bool = True,
    shuffle_seed: int | None = 0,
) -> Iterator[SFTDatasetChunk]:
    """Chunks of `chunk_size` optimizer batches over `epochs` shuffled passes, each with its config
    (`peak_lr` constant: agentrl has no learning-rate schedule), from `initial_step` on."""
    if epochs < 1 or batch_size < 1 or chunk_size < 1:
        raise ConfigurationError("epochs, batch_size and chunk_size must be >= 1")
    per_chunk = batch_size * chunk_size
    chunks_per_epoch = math.ceil(len(trajectories) / per_chunk)
    step = 0
    for epoch in range(epochs):
        order = list(trajectories)
        if shuffle_seed is not None:
            random.Random(shuffle_seed + epoch).shuffle(order)
        for epoch_step in range(chunks_per_epoch):
            if step >= initial_step:
                chunk = order[epoch_step * per_chunk : (epoch_step + 1) * per_chunk]
                yield SFTDatasetChunk(
                    chunk, TrainSFTConfig(learning_rate=peak_lr, batch_size=batch_size), step, epoch, epoch_step
                )
            step += 1


async def train_sft_from_file(
    model: Any,
    file_path: str | Path,
    epochs: int = 1,
    learning_rate: float = 2e-4,
    batch_size: int = 1,
    verbose: bool = False,
    log_metrics: bool = True,
    assistant_turns: Literal["all", "last"] = "all",
) -> agentrl.TrainResult:
    """Train `model` (registered) on the conversations of a JSONL file, `epochs` passes (`assistant_turns`: all of
    each conversation's assistant turns, or its last)."""
    from ..models import check_log_metrics

    check_log_metrics(log_metrics)
    trajectories = load_trajectories_from_file(file_path)
    if not trajectories:
        raise ConfigurationError(f"{file_path} holds no conversations")
    config = agentrl.SFTConfig(
        learning_rate=learning_rate, epochs=epochs, batch_size=batch_size, assistant_turns=assistant_turns
    )
    histories: list[agentrl.History] = list(trajectories)
    return await agentrl.TrainableModel.train_sft(model, histories, config)
