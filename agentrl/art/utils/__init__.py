"""ART's `art.utils`: iterate_dataset and limit_concurrency with ART's keywords."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, TypeVar

import agentrl
from agentrl.dataset import DatasetBatch
from agentrl.errors import ConfigurationError

T = TypeVar("T")
R = TypeVar("R")

__all__ = ["DatasetBatch", "iterate_dataset", "limit_concurrency"]


def iterate_dataset(
    dataset: Sequence[T],
    groups_per_step: int = 1,
    num_epochs: int = 1,
    initial_step: int = 0,
    use_tqdm: bool = True,
) -> Iterator[DatasetBatch[T]]:
    """ART's form of `agentrl.iterate_dataset`: batches (`.items`, `.step`, `.epoch`, `.epoch_step`)."""
    return agentrl.iterate_dataset(
        dataset, batch_size=groups_per_step, epochs=num_epochs, initial_step=initial_step, show_progress=use_tqdm
    )


def limit_concurrency(
    n: int, derive_key: Callable[..., Any] | None = None
) -> Callable[[Callable[..., Awaitable[R]]], Callable[..., Awaitable[R]]]:
    """ART's form of `agentrl.limit_concurrency` (one limit per function; `derive_key` is not supported)."""
    if derive_key is not None:
        raise ConfigurationError(
            "limit_concurrency(derive_key=...) is not supported: decorate one function per key, "
            "or hold an asyncio.Semaphore per key yourself"
        )
    return agentrl.limit_concurrency(n)
