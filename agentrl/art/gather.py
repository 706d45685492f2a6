"""ART's gathering: `gather_trajectory_groups`, `gather_trajectories`, `trajectory_group_batches`,
and the captured trajectories (`capture_auto_trajectory`, `auto_trajectory`, `yield_trajectory`).

ART's `max_exceptions` is a count, or a fraction of the rollouts when a float below 1. Groups may
be given as `TrajectoryGroup(rollouts)` or as any awaitable that returns a group.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

from tqdm.auto import tqdm

import agentrl
from agentrl.client.capture import capture_trajectory, current_trajectory
from agentrl.client.gather import ExceptionBudget
from agentrl.data.trajectory import Trajectory
from agentrl.data.trajectory_group import TrajectoryGroup
from agentrl.foundation.errors import ConfigurationError, RolloutError
from agentrl.rl.ledger import choice_tokens


def _budget(max_exceptions: int | float) -> dict[str, Any]:
    """ART's `max_exceptions` as agentrl's count or rate."""
    if isinstance(max_exceptions, float) and 0 < max_exceptions < 1:
        return {"max_exceptions": None, "max_exception_rate": max_exceptions}
    return {"max_exceptions": int(max_exceptions), "max_exception_rate": None}


def _allowed(max_exceptions: int | float, total: int) -> int:
    return ExceptionBudget(**_budget(max_exceptions)).allowed(total)


async def gather_trajectory_groups(
    groups: Iterable[Awaitable[TrajectoryGroup] | TrajectoryGroup],
    *,
    pbar_desc: str | None = "gather",
    pbar_total_completion_tokens: bool = False,
    max_exceptions: int | float = 0,
    max_metrics: int | None = None,
    after_each: Callable[[TrajectoryGroup], Awaitable[Any]] | None = None,
) -> list[TrajectoryGroup]:
    """Run the groups' rollouts concurrently and return the resolved groups in order.

    `after_each(group)` may return a group, None (drop it) or a list of groups (all kept, in place). A group given
    as an awaitable that raises counts as a failure against `max_exceptions` and is dropped, as ART drops it; past
    the budget the rollout's own exception is raised, as ART raises it.
    `pbar_total_completion_tokens` and `max_metrics` change only ART's progress bar and are accepted.
    """
    items = list(groups)
    expanded: dict[int, list[TrajectoryGroup]] = {}

    async def each(group: TrajectoryGroup) -> TrajectoryGroup | None:
        if group.metadata.pop(_AWAITED, False) and not group.trajectories:
            return None  # the awaitable itself raised: ART has no group to keep
        for trajectory in group.trajectories:
            _record_completion_tokens(trajectory)
        result: Any = await after_each(group) if after_each is not None else group
        if isinstance(result, list):
            if not result:
                return None
            expanded[id(result[0])] = result
            first: TrajectoryGroup = result[0]
            return first
        kept: TrajectoryGroup | None = result
        return kept

    # An awaitable that returns a group (an `async def`) is run as the one rollout of a group of its own.
    items = [g if isinstance(g, TrajectoryGroup) else TrajectoryGroup([g], metadata={_AWAITED: True}) for g in items]
    try:
        gathered = await agentrl.gather_trajectory_groups(
            items,  # type: ignore[arg-type]
            **_budget(max_exceptions),
            after_each=each,
            desc=pbar_desc or "gather",
            show_progress=pbar_desc is not None,
        )
    except RolloutError as error:
        if isinstance(error.__cause__, Exception):
            raise error.__cause__ from None  # ART raises the rollout's own exception
        raise
    return [g for group in gathered for g in expanded.get(id(group), [group])]


def _record_completion_tokens(trajectory: Trajectory) -> None:
    """ART 0.5.20+'s gather metric: the sampled tokens of all the trajectory's choices (every history's), summed;
    set only when every choice says how many it sampled (the engine's token ids, or one logprob per token)."""
    counts = [choice_tokens(c) for h in trajectory.histories() for c in h.choices()]
    if counts and all(n > 0 for n in counts):
        trajectory.metrics["completion_tokens"] = float(sum(counts))


_AWAITED = "_agentrl_art_awaited_group"
"""Marks (for the gather alone) a group built around an awaitable that returns a group."""


async def gather_trajectories(
    trajectories: Iterable[Awaitable[Trajectory | list[Trajectory]]],
    *,
    pbar_desc: str | None = "gather",
    pbar_total_completion_tokens: bool = False,
    max_exceptions: int | float = 0,
) -> list[Any]:
    """Run rollouts concurrently; results align with the inputs. With `max_exceptions` > 0 a failed
    rollout comes back as its exception, in place; past the budget (or at 0) the first failure raises."""
    rollouts = list(trajectories)
    bar = tqdm(total=len(rollouts), desc=pbar_desc or "gather", disable=pbar_desc is None)

    async def one(rollout: Awaitable[Any]) -> Any:
        try:
            result = await rollout
            for trajectory in result if isinstance(result, list) else [result]:
                if isinstance(trajectory, Trajectory):
                    _record_completion_tokens(trajectory)
            return result
        finally:
            bar.update(1)

    try:
        results = await asyncio.gather(*(one(r) for r in rollouts), return_exceptions=True)
    finally:
        bar.close()
    failures = [r for r in results if isinstance(r, BaseException)]
    for failure in failures:
        if not isinstance(failure, Exception):
            raise failure  # a cancellation or interrupt is never a rollout's failure
    if len(failures) > _allowed(max_exceptions, len(rollouts)):
        raise RolloutError(
            f"{len(failures)} of {len(rollouts)} rollouts failed; the first: {failures[0]!r}"
        ) from failures[0]
    return results


async def trajectory_group_batches(
    groups: Iterable[Awaitable[TrajectoryGroup] | TrajectoryGroup],
    *,
    batch_size: int,
    max_batch_exceptions: int | float = 0,
    max_concurrent_batches: int = 4,
    skip_batches: int = 0,
    pbar_desc: str | None = "batches",
    pbar_total_completion_tokens: bool = False,
) -> AsyncIterator[list[TrajectoryGroup]]:
    """Gather `groups` `batch_size` at a time (up to `max_concurrent_batches` gathering at once) and
    yield each batch of resolved groups, after skipping the first `skip_batches`; `max_batch_exceptions` failed
    rollouts (a count, or a fraction below 1) are allowed per batch. ART's keywords and defaults; a batch holds
    the next `batch_size` groups in input order (ART's fills a batch with whichever groups finish first)."""
    if batch_size < 1 or max_concurrent_batches < 1:
        raise ConfigurationError("trajectory_group_batches needs batch_size >= 1 and max_concurrent_batches >= 1")
    items = list(groups)
    for skipped in items[: skip_batches * batch_size]:  # never run: no "never awaited" noise
        for pending in skipped.pending if isinstance(skipped, TrajectoryGroup) else [skipped]:
            if inspect.iscoroutine(pending):
                pending.close()
    items = items[skip_batches * batch_size :]
    batches = [items[i : i + batch_size] for i in range(0, len(items), batch_size)]
    running: list[asyncio.Task[list[TrajectoryGroup]]] = []
    try:
        for batch in batches:
            running.append(
                asyncio.ensure_future(
                    gather_trajectory_groups(batch, pbar_desc=pbar_desc, max_exceptions=max_batch_exceptions)
                )
            )
            if len(running) >= max_concurrent_batches:
                yield await running.pop(0)
        while running:
            yield await running.pop(0)
    finally:
        for task in running:
            task.cancel()


async def capture_auto_trajectory(coroutine: Awaitable[Any]) -> Trajectory:
    """Run `coroutine` and return the trajectory of every OpenAI-format chat completion it made (as ART's: through
    agentrl's gateway or any other endpoint: `agentrl.capture_trajectory(every_endpoint=True)`), finished; set
    its reward inside with `auto_trajectory().reward = ...`."""
    with capture_trajectory(every_endpoint=True) as trajectory:
        await coroutine
    return trajectory.finish()


def auto_trajectory(*, required: bool = False) -> Trajectory | None:
    """The trajectory being captured now (inside `capture_auto_trajectory`), or None."""
    trajectory = current_trajectory()
    if trajectory is None and required:
        raise RuntimeError("auto_trajectory(required=True) outside capture_auto_trajectory(...)")
    return trajectory


_yielded: contextvars.ContextVar[list[Trajectory] | None] = contextvars.ContextVar("agentrl_art_yielded", default=None)


def yield_trajectory(trajectory: Trajectory) -> None:
    """Hand `trajectory` to the enclosing `capture_yielded_trajectory` (ART's way for a deep call to return one)."""
    holder = _yielded.get()
    if holder is None:
        raise RuntimeError("yield_trajectory(...) outside capture_yielded_trajectory(...)")
    holder.append(trajectory)


async def capture_yielded_trajectory(coroutine: Awaitable[Any]) -> Trajectory:
    """Run `coroutine` and return the trajectory it handed to `yield_trajectory` (the last one)."""
    holder: list[Trajectory] = []
    token = _yielded.set(holder)
    try:
        await coroutine
    finally:
        _yielded.reset(token)
    if not holder:
        raise RuntimeError("the coroutine finished without calling yield_trajectory(...)")
    return holder[-1]


__all__ = [
    "auto_trajectory",
    "capture_auto_trajectory",
    "capture_yielded_trajectory",
    "gather_trajectories",
    "gather_trajectory_groups",
    "trajectory_group_batches",
    "yield_trajectory",
]
