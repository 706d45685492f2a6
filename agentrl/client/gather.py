"""Concurrent rollout collection with a progress bar and an explicit exception budget.

A failed rollout is recorded in its group (`TrajectoryGroup.exceptions`) and counted; once the
failures exceed the budget, the remaining rollouts are cancelled and `RolloutError` is raised.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import uuid
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from tqdm.auto import tqdm

from agentrl.data.trajectory import Trajectory, reward_stats
from agentrl.data.trajectory_group import RolloutException, TrajectoryGroup, rollout_trajectories
from agentrl.foundation.errors import ConfigurationError, RolloutError
from agentrl.foundation.rollout_id import current_rollout
from agentrl.foundation.timeline import rollout_span, span

logger = logging.getLogger(__name__)


class AfterEach(Protocol):
    """Called on each group as soon as its rollouts finish (a judge scoring it while others still run):
    returns the group to keep, changed or not, or None to drop it."""

    def __call__(self, group: TrajectoryGroup, /) -> Awaitable[TrajectoryGroup | None]: ...


@dataclass(frozen=True)
class ExceptionBudget:
    """How many rollout failures a gather tolerates before it gives up.

    `max_exceptions` is a count, `max_exception_rate` a fraction of all rollouts; when both are
    set, the tighter one applies. Neither set: no failure is tolerated. Unlike ART, where a float
    `max_exceptions` below 1 is a fraction, a float count is refused rather than read as 0.
    """

    max_exceptions: int | None = None
    max_exception_rate: float | None = None

    def __post_init__(self) -> None:
        count = self.max_exceptions
        if isinstance(count, float):
            fix = f"max_exception_rate={count}" if 0 < count < 1 else f"max_exceptions={int(count)}"
            raise ConfigurationError(
                f"max_exceptions is a count of failed rollouts, got the float {count}; for a fraction of all "
                f"rollouts (ART's meaning of a float below 1) use {fix}"
            )
        if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
            raise ConfigurationError(f"max_exceptions is a count and must be an int >= 0, got {count!r}")
        rate = self.max_exception_rate
        if rate is not None and not (isinstance(rate, (int, float)) and 0.0 <= rate <= 1.0):
            raise ConfigurationError(f"max_exception_rate is a fraction in [0, 1], got {rate!r}")

    def allowed(self, total_rollouts: int) -> int:
        limits = [0] if self.max_exceptions is None and self.max_exception_rate is None else []
        if self.max_exceptions is not None:
            limits.append(self.max_exceptions)
        if self.max_exception_rate is not None:
            limits.append(int(self.max_exception_rate * total_rollouts))
        return min(limits)

    def tally(self, total_rollouts: int, of: str = "rollouts") -> FailureTally:
        """A count of failures against this budget over `total_rollouts` rollouts, which several gathers may share."""
        return FailureTally(allowed=self.allowed(total_rollouts), total=total_rollouts, of=of)


@dataclass
class FailureTally:
    """Rollout failures counted against one budget: one gather's, or every group of a pipelined loop step's,
    each group gathered on its own, so that a group of 8 at 10% still tolerates its share of the step's."""

    allowed: int
    total: int
    of: str = "rollouts"
    """What the total counts, for the error ("rollouts", "rollouts of loop step 3")."""
    failures: list[BaseException] = field(default_factory=list)

    def count(self, error: BaseException) -> None:
        """Count a failure; `RolloutError` once there are more than allowed."""
        self.failures.append(error)
        if len(self.failures) > self.allowed:
            first = self.failures[0]
            raise RolloutError(
                f"{len(self.failures)} of {self.total} {self.of} failed, more than the {self.allowed} allowed "
                "(raise max_exceptions / max_exception_rate to tolerate more); first failure: "
                f"{type(first).__name__}: {first}"
            ) from first


class RolloutProgress:
    """One tqdm bar over rollouts, showing the running mean reward, of every metric, and failures; several
    gathers may share one (a pipelined loop step's groups, each gathered on its own)."""

    def __init__(self, total: int, desc: str, enabled: bool = True) -> None:
        self.bar = tqdm(total=total, desc=desc, disable=not enabled, unit="rollout")
        self.rewards: list[float] = []
        self.metric_values: dict[str, list[float]] = {}
        self.exceptions = 0

    def update(self, trajectory: Trajectory | None) -> None:
        if trajectory is None:
            self.exceptions += 1
        else:
            self.rewards.append(trajectory.reward)
            for name, value in trajectory.metrics.items():
                self.metric_values.setdefault(name, []).append(value)
        mean, _ = reward_stats(self.rewards)
        postfix = {"reward": f"{mean:.3f}"}
        for name, values in sorted(self.metric_values.items()):
            postfix.setdefault(name, f"{sum(values) / len(values):.3g}")
        postfix["exceptions"] = str(self.exceptions)
        self.bar.set_postfix(postfix, refresh=False)
        self.bar.update(1)


async def _run_rollouts(
    groups: list[TrajectoryGroup], tally: FailureTally, progress: RolloutProgress, after_each: AfterEach | None
) -> list[TrajectoryGroup | None]:
    async def run_one(
        rollout: Awaitable[Trajectory | TrajectoryGroup], where: str
    ) -> list[Trajectory] | tuple[BaseException, str]:
        rollout_id = uuid.uuid4().hex
        current_rollout.set(rollout_id)  # this task's own context: the backend's client sends it along
        try:
            with rollout_span(where):
                trajectories = rollout_trajectories(await rollout, where)
        except Exception as error:  # noqa: BLE001 - a rollout's failure is data, judged by the budget
            logger.warning("rollout failed: %s: %s", type(error).__name__, error)
            progress.update(None)
            tally.count(error)
            return error, rollout_id
        for trajectory in trajectories:
            progress.update(trajectory)
        return trajectories

    async def run_group(group_index: int, group: TrajectoryGroup) -> TrajectoryGroup | None:
        label = f"group {group_index}" + (f" ({group.metadata})" if group.metadata else "")
        results = await asyncio.gather(*(run_one(r, f"{label}, rollout {i}") for i, r in enumerate(group.pending)))
        resolved = group.with_results(
            [*group.trajectories, *(t for r in results if isinstance(r, list) for t in r)],
            exceptions=[
                *group.exceptions,
                *(RolloutException.from_exception(r[0], rollout_id=r[1]) for r in results if isinstance(r, tuple)),
            ],
        )
        if after_each is None:
            return resolved
        with span("after each (judge)", "judge", group=label):
            return await after_each(resolved)

    tasks = [asyncio.ensure_future(run_group(i, g)) for i, g in enumerate(groups)]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def gather_trajectory_groups(
    groups: Iterable[TrajectoryGroup],
    *,
    max_exceptions: int | None = None,
    max_exception_rate: float | None = None,
    after_each: AfterEach | None = None,
    desc: str = "rollouts",
    show_progress: bool = True,
) -> list[TrajectoryGroup]:
    """Run every group's rollouts concurrently and return the resolved groups, in input order.

    `after_each` is awaited on each group as soon as it completes (e.g. a judge); it returns the
    group to keep (possibly a new one) or None to drop it.
    """
    groups = list(groups)
    try:
        budget = ExceptionBudget(max_exceptions, max_exception_rate)
    except ConfigurationError:
        for pending in (p for g in groups for p in g.pending):  # they will never run: no "never awaited" noise
            if inspect.iscoroutine(pending):
                pending.close()
        raise
    tally = budget.tally(sum(len(g.pending) for g in groups))
    return await gather_counted(groups, tally, after_each=after_each, desc=desc, show_progress=show_progress)


async def gather_counted(
    groups: list[TrajectoryGroup],
    tally: FailureTally,
    *,
    after_each: AfterEach | None = None,
    desc: str = "rollouts",
    show_progress: bool = True,
    progress: RolloutProgress | None = None,
) -> list[TrajectoryGroup]:
    """`gather_trajectory_groups` with the failures counted in `tally`, which other gathers may share; with
    `progress`, on that bar (its owner closes it) instead of one of its own."""
    own = progress is None
    progress = progress or RolloutProgress(sum(len(g.pending) for g in groups), desc, show_progress)
    try:
        finished = await _run_rollouts(groups, tally, progress, after_each)
    finally:
        if own:
            progress.bar.close()
    kept = [g for g in finished if g is not None]
    if len(kept) < len(finished):
        logger.info("after_each dropped %d of %d groups", len(finished) - len(kept), len(finished))
    return kept


async def gather_trajectories(
    rollouts: Iterable[Awaitable[Trajectory]],
    *,
    max_exceptions: int | None = None,
    max_exception_rate: float | None = None,
    desc: str = "rollouts",
    show_progress: bool = True,
) -> list[Trajectory]:
    """Run rollouts concurrently (no grouping, e.g. for evaluation) and return those that finished."""
    (group,) = await gather_trajectory_groups(
        [TrajectoryGroup(rollouts)],
        max_exceptions=max_exceptions,
        max_exception_rate=max_exception_rate,
        desc=desc,
        show_progress=show_progress,
    )
    return group.trajectories
