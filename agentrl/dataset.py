"""Walking a training set in steps: `iterate_dataset` yields one batch of scenarios per training step,
epoch after epoch, shuffled the same way on every run so that a resumed run continues where it stopped."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from tqdm.auto import tqdm

from agentrl.errors import ConfigurationError

T = TypeVar("T")


@dataclass(frozen=True)
class DatasetBatch(Generic[T]):
    """The scenarios of one training step, and where that step sits in the run."""

    items: list[T]
    step: int
    """The training step this batch is for (0-based, counted over all epochs)."""
    epoch: int
    epoch_step: int
    """The batch's index within its epoch."""


def iterate_dataset(
    dataset: Sequence[T],
    *,
    batch_size: int = 1,
    epochs: int = 1,
    initial_step: int = 0,
    shuffle: bool = True,
    seed: int = 0,
    show_progress: bool = True,
) -> Iterator[DatasetBatch[T]]:
    """Batches of `batch_size` scenarios (the last of an epoch may be smaller), `epochs` times over.

    Epoch e is shuffled with `seed + e`, so the order is the same on every run, and `initial_step`
    (pass `await model.get_step()`) skips the steps a resumed run already trained on.
    """
    if batch_size < 1 or epochs < 1 or initial_step < 0:
        raise ConfigurationError(
            f"iterate_dataset needs batch_size >= 1, epochs >= 1 and initial_step >= 0; "
            f"got batch_size={batch_size}, epochs={epochs}, initial_step={initial_step}"
        )
    if len(dataset) == 0:
        raise ConfigurationError("iterate_dataset got an empty dataset: pass the training scenarios")
    steps_per_epoch = math.ceil(len(dataset) / batch_size)
    total = steps_per_epoch * epochs
    with tqdm(total=total, initial=min(initial_step, total), desc="steps", disable=not show_progress) as bar:
        for epoch in range(initial_step // steps_per_epoch, epochs):
            order = list(range(len(dataset)))
            if shuffle:
                random.Random(seed + epoch).shuffle(order)
            for epoch_step in range(steps_per_epoch):
                step = epoch * steps_per_epoch + epoch_step
                if step < initial_step:
                    continue
                indices = order[epoch_step * batch_size : (epoch_step + 1) * batch_size]
                yield DatasetBatch([dataset[i] for i in indices], step, epoch, epoch_step)
                bar.update(1)
