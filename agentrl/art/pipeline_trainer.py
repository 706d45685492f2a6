"""ART's `art.pipeline_trainer.PipelineTrainer`, on `agentrl.train_pipelined`: rollouts for the next
steps sample while a step trains, at most `max_steps_off_policy` steps behind the served adapter.

Each step trains on `min_batch_size` groups, one per scenario (`rollout_fn(model, scenario, config)`
returns the group). Scenarios are read as the run goes, as ART reads them: a sync or async iterable,
endless generators included, is never read ahead of the steps that sample it. `eval_fn(model, step, config)`
runs at the start and every `eval_every_n_steps`, and its trajectories are logged as "val". With `resume`, a
run passes over the scenarios committed steps consumed (the run's record, `TrainableModel.trained_scenarios`,
by content), so a crash repeats or skips none. `max_steps` counts from the step the run starts at, as ART's;
`total_scenarios` only sizes the progress line, as ART's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterable, Awaitable, Callable, Collection, Iterable, Iterator
from typing import Any

from tqdm.auto import tqdm

import agentrl
from agentrl.dataset import content_digest, repeated_id
from agentrl.errors import ConfigurationError
from agentrl.pipeline import train_pipelined
from agentrl.records.scenario_record import scenario_key
from agentrl.trajectory import Trajectory, TrajectoryGroup

from .training import agentrl_train_config

logger = logging.getLogger(__name__)

RolloutFn = Callable[[Any, Any, Any], Awaitable[TrajectoryGroup]]
EvalFn = Callable[[Any, int, Any], Awaitable[Any]]


class PipelineTrainer:
    """ART's pipelined trainer. Keys agentrl has no counterpart for (`queue_maxsize`,
    `discard_queue_multiplier`, `log_interval_seconds`, `status_ewa_alpha`: ART's queue and status line)
    are accepted; training keys go through the same mapping as `backend.train`'s."""

    def __init__(
        self,
        model: agentrl.TrainableModel,
        backend: Any,
        rollout_fn: RolloutFn,
        scenarios: Iterable[Any] | AsyncIterable[Any],
        config: Any,
        eval_fn: EvalFn | None = None,
        *,
        num_rollout_workers: int = 16,
        min_batch_size: int = 4,
        max_batch_size: int | None = None,
        max_steps_off_policy: int = 4,
        queue_maxsize: int | None = None,
        learning_rate: float = 1e-5,
        loss_fn: str = "cispo",
        loss_fn_config: dict[str, Any] | None = None,
        normalize_advantages: bool = True,
        adam_params: Any = None,
        packed_sequence_length: int | None = None,
        kl_penalty_coef: float = 0.0,
        kl_penalty_step_lag: int | None = None,
        megatron_topology: Any = None,
        max_steps: int | None = None,
        discard_queue_multiplier: int = 100,
        log_interval_seconds: float = 60.0,
        status_ewa_alpha: float = 0.2,
        total_scenarios: int | None = None,
        eval_every_n_steps: int = 20,
        eval_at_start: bool = True,
        save_checkpoint: bool = True,
        checkpoint_retention_strategy: str | None = None,
        checkpoint_retention_interval: int = 1,
        resume: bool = True,
    ) -> None:
        if min_batch_size < 1 or num_rollout_workers < 1:
            raise ConfigurationError("min_batch_size and num_rollout_workers must be >= 1")
        if max_batch_size is not None and max_batch_size < min_batch_size:
            raise ConfigurationError(f"max_batch_size {max_batch_size} is below min_batch_size {min_batch_size}")
        if checkpoint_retention_strategy is not None:
            raise ConfigurationError(
                f"checkpoint_retention_strategy={checkpoint_retention_strategy!r} has no counterpart: call "
                "`await model.delete_checkpoints(...)` after training (it keeps the latest and the best)"
            )
        self.train_config = agentrl_train_config({
            "learning_rate": learning_rate, "loss_fn": loss_fn, "loss_fn_config": loss_fn_config,
            "normalize_advantages": normalize_advantages, "adam_params": adam_params,
            "packed_sequence_length": packed_sequence_length, "kl_penalty_coef": kl_penalty_coef,
            "kl_penalty_step_lag": kl_penalty_step_lag, "megatron_topology": megatron_topology,
            "save_checkpoint": save_checkpoint,
            # ART's PipelineTrainer measures its KL penalty from the sampler's logprobs (the rollouts are off-policy)
            "kl_penalty_source": "sample" if kl_penalty_coef > 0 else "current_learner",
        })  # fmt: skip
        self.model, self.backend, self.rollout_fn, self.scenarios = model, backend, rollout_fn, scenarios
        self.config, self.eval_fn = config, eval_fn
        self.min_batch_size, self.max_steps, self.total_scenarios = min_batch_size, max_steps, total_scenarios
        self.max_steps_off_policy = max_steps_off_policy
        self.eval_every_n_steps, self.eval_at_start, self.resume = eval_every_n_steps, eval_at_start, resume
        self._workers = asyncio.Semaphore(num_rollout_workers)
        self.results: list[agentrl.TrainResult] = []

    async def _rollout(self, scenario: Any) -> TrajectoryGroup:
        async with self._workers:
            group = await self.rollout_fn(self.model, scenario, self.config)
        if not isinstance(group, TrajectoryGroup):
            raise TypeError(f"rollout_fn returned {type(group).__name__}; it must return an art.TrajectoryGroup")
        return group

    async def _evaluate(self, step: int) -> None:
        if self.eval_fn is None:
            return
        results = await self.eval_fn(self.model, step, self.config)
        items = list(results.values()) if isinstance(results, dict) else list(results or [])
        flat: list[Trajectory] = []
        for item in items:
            flat.extend(item.trajectories if isinstance(item, TrajectoryGroup) else [item])
        if flat:
            await agentrl.TrainableModel.log(self.model, flat, "val")

    async def train(self, *, handle_signals: bool = True) -> list[agentrl.TrainResult]:
        """Train until the scenarios run out, or `max_steps` steps past the start; returns each step's result.
        With `handle_signals` (ART's default), Ctrl-C or SIGTERM stops reading scenarios: the steps already
        sampling train, then it returns."""
        if not self.model.registered:
            await self.model.register(self.backend)
        start = await self.model.get_step()
        source = _ScenarioSource(self.scenarios, self.model.trained_scenarios() if self.resume else ())
        if self.eval_at_start:
            await self._evaluate(start)
        if self.max_steps == 0:
            return []
        progress = tqdm(
            total=self.total_scenarios, desc="scenarios", unit="scenario", disable=self.total_scenarios is None
        )

        async def make_groups(model: agentrl.TrainableModel, step: int) -> list[TrajectoryGroup]:
            items, keys = await source.next_batch(self.min_batch_size)
            progress.update(len(items))
            batch = agentrl.DatasetBatch(items, step - start, 0, step - start, keys)
            return batch.groups(lambda scenario: TrajectoryGroup([self._rollout(scenario)]))

        async def on_step(result: agentrl.TrainResult) -> None:
            if self.eval_every_n_steps > 0 and result.step % self.eval_every_n_steps == 0:
                await self._evaluate(result.step)

        with _stopping_on_signals(source, enabled=handle_signals), progress:
            self.results = await train_pipelined(
                self.model,
                make_groups,
                steps=self.max_steps,
                max_steps_off_policy=self.max_steps_off_policy,
                config=self.train_config,
                on_step=on_step,
            )
        if not self.results:
            logger.info("PipelineTrainer: nothing to train (resumed at step %d, %d scenarios read)", start, source.read)
        return self.results


class _ScenarioSource:
    """ART's scenarios, read a batch at a time as steps need them (a sync or async iterable, perhaps endless),
    each named by its content as `iterate_dataset` names them ("0:{digest}", repeats ".1", ...; a scenario that
    is not JSON data by its position), those a committed step consumed passed over."""

    def __init__(self, scenarios: Iterable[Any] | AsyncIterable[Any], trained: Collection[str]) -> None:
        self._async = scenarios.__aiter__() if isinstance(scenarios, AsyncIterable) else None
        self._sync = None if self._async is not None else iter(scenarios)  # type: ignore[arg-type]
        self.trained = set(trained)
        self.read = 0
        self.stopped = False
        self._seen: dict[str, int] = {}
        self._lock = asyncio.Lock()

    async def _next(self) -> tuple[bool, Any]:
        try:
            return True, (await anext(self._async) if self._async is not None else next(self._sync))  # type: ignore[arg-type]
        except (StopIteration, StopAsyncIteration):
            return False, None

    async def next_batch(self, size: int) -> tuple[list[Any], list[str]]:
        """Up to `size` untrained scenarios and their keys; none once the source ran out or a stop was asked for."""
        items: list[Any] = []
        keys: list[str] = []
        async with self._lock:
            while len(items) < size and not self.stopped:
                more, item = await self._next()
                if not more:
                    self.stopped = True
                    break
                self.read += 1
                digest = content_digest(item)
                key = scenario_key(0, repeated_id(digest, self._seen) if digest is not None else str(self.read - 1))
                if key not in self.trained:
                    items.append(item)
                    keys.append(key)
        return items, keys


@contextlib.contextmanager
def _stopping_on_signals(source: _ScenarioSource, *, enabled: bool) -> Iterator[None]:
    """With `enabled`, SIGINT and SIGTERM stop `source` (the run ends once the steps already sampling have trained)
    instead of interrupting; the handlers before are put back afterwards."""
    loop = asyncio.get_running_loop()
    installed = []
    if enabled:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, _stop, source, sig)
                installed.append(sig)
    try:
        yield
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


def _stop(source: _ScenarioSource, sig: signal.Signals) -> None:
    if not source.stopped:
        logger.warning(
            "%s: reading no more scenarios; the steps already sampling train, then the run returns", sig.name
        )
    source.stopped = True
