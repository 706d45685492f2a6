"""Walking a training set in steps: `iterate_dataset` yields one batch of scenarios per training step,
epoch after epoch, shuffled the same way on every run so that a resumed run continues where it stopped.

Exactly once across crashes: build each batch's groups with `batch.groups(...)`, which names every group's
scenario, and start with `iterate_dataset(..., already_trained=model.trained_scenarios())`; the run's
record (`agentrl.records.scenario_record`) then says which scenarios committed steps consumed, and those are left out.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import random
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pydantic import BaseModel
from tqdm.auto import tqdm

from agentrl.data.trajectory_group import TrajectoryGroup
from agentrl.foundation.errors import ConfigurationError
from agentrl.records.scenario_record import SCENARIO, scenario_key

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
    keys: list[str] = field(default_factory=list)
    """Each item's scenario key, "{epoch}:{id}" (the id: `content_ids`, or `scenario_id(item)`)."""

    def groups(self, make_group: Callable[[T], TrajectoryGroup]) -> list[TrajectoryGroup]:
        """`make_group(item)` for each item, each group named by its scenario's key, so that the step that
        trains it records it (`model.trained_scenarios()`)."""
        groups = []
        for item, key in zip(self.items, self.keys, strict=True):
            group = make_group(item)
            group.metadata[SCENARIO] = key
            groups.append(group)
        return groups


def _as_json(item: Any) -> str:
    """An item as canonical JSON (pydantic models and dataclasses as their fields); TypeError if it is not data."""
    if isinstance(item, BaseModel):
        item = item.model_dump(mode="json")
    elif dataclasses.is_dataclass(item) and not isinstance(item, type):
        item = dataclasses.asdict(item)
    return json.dumps(item, sort_keys=True, separators=(",", ":"))


def content_ids(dataset: Sequence[Any]) -> list[str]:
    """Each item's id from its content (16 hex digits of the sha256 of its JSON; a repeated item gets ".1",
    ".2", ... in order), so a resumed run finds its trained scenarios in a dataset that was rebuilt larger,
    smaller or in another order. Items that are not JSON data (nor pydantic models or dataclasses of it)
    are named by their index instead, which assumes the same dataset on resume."""
    digests = [content_digest(item) for item in dataset]
    if any(digest is None for digest in digests):
        return [str(index) for index in range(len(dataset))]
    seen: dict[str, int] = {}
    return [repeated_id(str(digest), seen) for digest in digests]


def content_digest(item: Any) -> str | None:
    """16 hex digits of the sha256 of an item's JSON (`content_ids`); None for an item that is not JSON data."""
    try:
        return hashlib.sha256(_as_json(item).encode()).hexdigest()[:16]
    except (TypeError, ValueError):
        return None


def repeated_id(digest: str, seen: dict[str, int]) -> str:
    """`digest`, or `digest.N` for its Nth repeat among those `seen` so far (which it updates)."""
    repeat = seen[digest] = seen.get(digest, -1) + 1
    return f"{digest}.{repeat}" if repeat else digest


def iterate_dataset(
    dataset: Sequence[T],
    *,
    batch_size: int = 1,
    epochs: int = 1,
    initial_step: int = 0,
    shuffle: bool = True,
    seed: int = 0,
    already_trained: Collection[str] = (),
    scenario_id: Callable[[T], str | int] | None = None,
    show_progress: bool = True,
) -> Iterator[DatasetBatch[T]]:
    """Batches of `batch_size` scenarios (the last of an epoch may be smaller), `epochs` times over.

    Epoch e is shuffled with `seed + e`, so the order is the same on every run. To resume, either pass
    `already_trained=model.trained_scenarios()` (exact: every batch loses the scenarios a committed step
    consumed, and a batch left empty is not yielded) or `initial_step=await model.get_step()` (ART's way:
    skips that many batches, which is wrong after a skipped step or a pipelined run's look-ahead).
    `scenario_id(item)` names a scenario in its key (default: `content_ids`, from the item's content).
    """
    if batch_size < 1 or epochs < 1 or initial_step < 0:
        raise ConfigurationError(
            f"iterate_dataset needs batch_size >= 1, epochs >= 1 and initial_step >= 0; "
            f"got batch_size={batch_size}, epochs={epochs}, initial_step={initial_step}"
        )
    if initial_step and already_trained:
        raise ConfigurationError(
            "iterate_dataset got both initial_step and already_trained: pass only already_trained "
            "(model.trained_scenarios()), which knows which scenarios were trained, not only how many steps"
        )
    if len(dataset) == 0:
        raise ConfigurationError("iterate_dataset got an empty dataset: pass the training scenarios")
    trained = set(already_trained)
    ids = [scenario_id(item) for item in dataset] if scenario_id else content_ids(dataset)
    if len(set(ids)) != len(ids):
        raise ConfigurationError("scenario_id gives two scenarios the same id: each needs its own, to be recorded")
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
                keys = {i: scenario_key(epoch, ids[i]) for i in indices}
                indices = [i for i in indices if keys[i] not in trained]
                if indices:
                    items = [dataset[i] for i in indices]
                    yield DatasetBatch(items, step, epoch, epoch_step, [keys[i] for i in indices])
                bar.update(1)
