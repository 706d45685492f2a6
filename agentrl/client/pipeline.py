"""Pipelined training: rollouts keep sampling while the trainer trains, and a step starts on the first
finished groups instead of waiting for the slowest.

The synchronous loop alternates: gather a step's groups, then train while nothing samples. Here
the groups of the next `max_steps_off_policy` steps are already sampling (against whatever
adapter is served) while a step trains, and each step takes the first groups to finish. Every
sampled turn records the adapter step that produced it (`policy_step`, stamped by the gateway), and
the loss uses the sampler's own logprobs as the old policy, so an off-policy turn is importance-
corrected; `TrainConfig(truncated_importance_sampling=2.0)` bounds that correction, the setting we
recommend for `max_steps_off_policy > 0`. A group whose oldest turn is more than
`max_steps_off_policy` steps behind the step it would train is dropped and counted, never trained (with `drop_stale=False` it trains, its staleness recorded).
With `max_steps_off_policy=0` the loop is the synchronous one: each step's groups start after the
previous step, and train together. It is agentrl's one training loop: the environments' entry points,
MCP-RL and judge RL all run on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from agentrl.client.backend_protocol import ReportsSpinning, TrainResult
from agentrl.client.gather import AfterEach, ExceptionBudget, FailureTally, RolloutProgress, gather_counted
from agentrl.client.model import TrainableModel
from agentrl.data.trajectory_group import TrajectoryGroup
from agentrl.foundation.config import TrainConfig
from agentrl.foundation.errors import ConfigurationError
from agentrl.foundation.openmp_spin import warn_spinning_beside_the_server
from agentrl.foundation.timeline import sampling

logger = logging.getLogger(__name__)

MakeGroups = Callable[[TrainableModel, int], Iterable[TrajectoryGroup] | Awaitable[Iterable[TrajectoryGroup]]]
"""A step's groups, unresolved (their rollouts as awaitables): `make_groups(model, step)`, or a coroutine giving them
(a source read lazily); no groups: the source has run out."""
OnStep = Callable[[TrainResult], Awaitable[None] | None]


def oldest_policy_step(group: TrajectoryGroup, started_at: int) -> int:
    """The oldest adapter step among a group's sampled turns; a turn that does not say (a client that
    dropped the gateway's `policy_step`) counts as `started_at`, the step served when its rollout began,
    which is never newer than the truth."""
    steps = [started_at if step is None else step for t in group.trajectories for step in t.policy_steps()]
    return min(steps, default=started_at)


@dataclass
class _StepBar:
    """A loop step's progress bar, shared by its groups' gathers, and how many of them are still sampling."""

    progress: RolloutProgress
    unfinished: int


@dataclass
class _Finished:
    group: TrajectoryGroup
    oldest_step: int
    order: tuple[int, int]  # (loop step, index in what make_groups gave): a step trains its groups in this order


async def train_pipelined(
    model: TrainableModel,
    make_groups: MakeGroups,
    *,
    steps: int | None,
    max_steps_off_policy: int = 1,
    config: TrainConfig | None = None,
    after_each: AfterEach | None = None,
    max_exception_rate: float | None = 0.1,
    on_step: OnStep | None = None,
    drop_stale: bool = True,
) -> list[TrainResult]:
    """Train `steps` steps of `model` (registered) with sampling and training overlapped; returns each step's result.
    With `steps=None` it trains until `make_groups` gives no groups (a lazily read, perhaps endless, source).

    `make_groups(model, step)` gives the groups of loop step `step` (counted from the model's step at
    the start, as the synchronous loop counts), their rollouts unstarted; a step trains on as many
    finished groups as its `make_groups` gave. `after_each` (a judge) runs on each group as it
    finishes; `on_step` after each step (an evaluation every N steps, a print). A step may train groups
    of later loop steps that finished first: to resume by scenario rather than by step count, build the
    groups with `DatasetBatch.groups` on `iterate_dataset(..., already_trained=model.trained_scenarios())`
    batches; a stale group counts as consumed by the step that dropped it, and one `after_each` dropped by
    the next step. `max_exception_rate` is a fraction of each loop step's rollouts, all its groups
    together (as the synchronous loop's gather of that step counts them); a failed rollout stays in its
    group's `exceptions`. Each step's metrics.jsonl line adds `staleness_mean`/`staleness_max` (steps
    between a group's oldest turn and the step it trained), `num_groups_stale_dropped`, and over the cycle since the previous
    step began training: `trainer_idle_frac` (waiting for groups), `sampler_idle_frac` (no rollout
    running: the gaps between the timeline's "rollouts" spans, from `agentrl.foundation.timeline.sampling`) and
    `steps_per_hour`.
    """
    if isinstance(max_steps_off_policy, bool) or not isinstance(max_steps_off_policy, int) or max_steps_off_policy < 0:
        raise ConfigurationError(f"max_steps_off_policy must be an int >= 0, got {max_steps_off_policy!r}")
    backend = model.backend if max_steps_off_policy > 0 and isinstance(model.backend, ReportsSpinning) else None
    async with backend.pipelined_cores() if backend else contextlib.nullcontext(False) as trainer_on_one_thread:
        if backend and (fix := backend.pipelined_spin_fix()):
            warn_spinning_beside_the_server(fix, trainer_on_one_thread=trainer_on_one_thread)
        return await _overlapped(
            model, make_groups, steps, max_steps_off_policy, config, after_each, max_exception_rate, on_step, drop_stale
        )


async def _overlapped(
    model: TrainableModel,
    make_groups: MakeGroups,
    steps: int | None,
    max_steps_off_policy: int,
    config: TrainConfig | None,
    after_each: AfterEach | None,
    max_exception_rate: float | None,
    on_step: OnStep | None,
    drop_stale: bool = True,
) -> list[TrainResult]:
    """`train_pipelined`'s loop, its arguments checked: each step takes what has finished sampling while
    later steps' groups sample on."""
    config = config or TrainConfig()
    sampler = _Sampler(
        model, make_groups, await model.get_step(), steps, max_steps_off_policy, after_each, max_exception_rate
    )
    sampler.drop_stale = drop_stale
    results: list[TrainResult] = []
    try:
        cycle_started, sampler_busy_at_cycle_start = time.time(), sampling.busy_s()
        done = 0
        while steps is None or done < steps:
            await sampler.launch(done)
            if done >= len(sampler.sizes):
                break  # the source ran out
            waiting_started = time.time()
            taken, stale = await sampler.take(sampler.sizes[done])
            taken.sort(key=lambda finished: finished.order)  # as make_groups gave them, not as they finished
            if stale:
                logger.warning("dropped %d groups sampled more than %d steps ago", len(stale), max_steps_off_policy)
            # A cycle runs from the previous step's start of training to this one's: one training and one wait.
            now, sampler_busy = time.time(), sampling.busy_s()
            cycle_s = max(now - cycle_started, 1e-9)
            staleness = [model.step - f.oldest_step for f in taken]
            step_metrics = {
                "max_steps_off_policy": float(max_steps_off_policy),
                "staleness_mean": sum(staleness) / len(staleness) if staleness else 0.0,
                "staleness_max": float(max(staleness, default=0)),
                "num_groups_stale_dropped": float(len(stale)),
                "trainer_idle_frac": (now - waiting_started) / cycle_s,
                "sampler_idle_frac": max(1.0 - (sampler_busy - sampler_busy_at_cycle_start) / cycle_s, 0.0),
                "steps_per_hour": 3600.0 / cycle_s,
            }
            cycle_started, sampler_busy_at_cycle_start = now, sampler_busy
            dropped = [*stale, *sampler.judge_dropped]
            sampler.judge_dropped.clear()
            result = await model.train([f.group for f in taken], config, step_metrics=step_metrics, dropped=dropped)
            results.append(result)
            done += 1
            if on_step is not None and (pending := on_step(result)) is not None:
                await pending
        return results
    finally:
        await sampler.cancel()


class _Sampler:
    """The rollouts of a pipelined run: each loop step's groups started as soon as the bound allows, and the
    groups that finished, in the order they did, for the trainer to take."""

    def __init__(
        self,
        model: TrainableModel,
        make_groups: MakeGroups,
        first: int,
        steps: int | None,
        max_steps_off_policy: int,
        after_each: AfterEach | None,
        max_exception_rate: float | None,
    ) -> None:
        self.model, self.make_groups, self.first, self.steps = model, make_groups, first, steps
        self.max_steps_off_policy, self.after_each = max_steps_off_policy, after_each
        self.budget = ExceptionBudget(max_exception_rate=max_exception_rate)
        self.ready: list[_Finished] = []
        self.arrived = asyncio.Event()
        self.tasks: set[asyncio.Task[None]] = set()
        self.failures: list[BaseException] = []
        self.in_flight = 0  # groups started and not yet finished, judged or failed
        self.sizes: list[int] = []  # groups per loop step whose groups were started, as make_groups gave them
        self.judge_dropped: list[TrajectoryGroup] = []
        self.bars: dict[int, _StepBar] = {}  # by loop step, while its groups sample
        self.drop_stale = True  # False: a group trains however stale (ART's PipelineTrainer(max_steps_off_policy=None))

    async def launch(self, done: int) -> None:
        """Start the groups of every loop step that may sample now: up to `max_steps_off_policy` ahead, and no
        further than the source goes (a step given no groups ends it)."""
        while (self.steps is None or len(self.sizes) < self.steps) and len(
            self.sizes
        ) <= done + self.max_steps_off_policy:
            loop_step = self.first + len(self.sizes)
            made = self.make_groups(self.model, loop_step)
            groups = list(await made if inspect.isawaitable(made) else made)
            if not groups:
                self.steps = len(self.sizes)
                return
            self.sizes.append(len(groups))
            # The budget is the step's, as in the synchronous loop's one gather: a group of 8 at 10% alone would
            # tolerate no failure at all.
            rollouts = sum(len(g.pending) for g in groups)
            tally = self.budget.tally(rollouts, of=f"rollouts of loop step {loop_step}")
            of_steps = f"/{self.first + self.steps}" if self.steps is not None else ""
            self.bars[loop_step] = _StepBar(
                RolloutProgress(rollouts, f"step {loop_step + 1}{of_steps} rollouts"), len(groups)
            )
            for index, group in enumerate(groups):
                self.in_flight += 1  # counted from now: the loop must not think nothing is coming
                task = asyncio.ensure_future(self._sample(group, tally, (loop_step, index)))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)

    async def _sample(self, group: TrajectoryGroup, tally: FailureTally, order: tuple[int, int]) -> None:
        started_at = self.model.step  # the adapter served when the rollout begins
        bar = self.bars[order[0]]
        try:
            finished = await gather_counted([group], tally, after_each=self.after_each, progress=bar.progress)
            for resolved in finished:
                self.ready.append(_Finished(resolved, oldest_policy_step(resolved, started_at), order))
            if not finished:  # `after_each` dropped it: consumed by the next step, as the synchronous loop does
                self.judge_dropped.append(group)
        except Exception as error:  # noqa: BLE001 - raised in the loop, which stops everything
            self.failures.append(error)
        finally:
            self.in_flight -= 1
            self.arrived.set()
            bar.unfinished -= 1
            if not bar.unfinished:  # the loop step's last group: its bar is done (an endless source keeps none)
                bar.progress.bar.close()
                self.bars.pop(order[0], None)

    async def take(self, count: int) -> tuple[list[_Finished], list[TrajectoryGroup]]:
        """Up to `count` finished groups within the bound, waiting for them, and the stale ones passed on the
        way; fewer when a judge dropped some and nothing else is sampling. A rollout failure raises here."""
        taken: list[_Finished] = []
        stale: list[TrajectoryGroup] = []
        while len(taken) < count:
            if self.failures:
                raise self.failures[0]
            if not self.ready:
                if self.in_flight == 0:
                    break
                self.arrived.clear()
                await self.arrived.wait()
                continue
            finished = self.ready.pop(0)
            if self.drop_stale and self.model.step - finished.oldest_step > self.max_steps_off_policy:
                stale.append(finished.group)
            else:
                taken.append(finished)
        return taken, stale

    async def cancel(self) -> None:
        """Stop the groups of steps that will not train."""
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for bar in self.bars.values():
            bar.progress.bar.close()
        self.bars.clear()
