"""ART's `art.utils.iterate_dataset`: batches of scenarios per step, over epochs."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeVar

import agentrl
from agentrl.client.dataset import DatasetBatch

T = TypeVar("T")

__all__ = ["DatasetBatch", "iterate_dataset"]


def iterate_dataset(
    dataset: Sequence[T], groups_per_step: int = 1, num_epochs: int = 1, initial_step: int = 0, use_tqdm: bool = True
) -> Iterator[DatasetBatch[T]]:
    """Batches (`.items`, `.step`, `.epoch`, `.epoch_step`) of `groups_per_step` scenarios, from `initial_step` on;
    none for an empty dataset (as ART: agentrl's own `iterate_dataset` refuses one, which is usually a mistake)."""
    if len(dataset) == 0:
        return iter(())
    return agentrl.iterate_dataset(
        dataset, batch_size=groups_per_step, epochs=num_epochs, initial_step=initial_step, show_progress=use_tqdm
    )
