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
import warnings
from collections.abc import AsyncIterable, Awaitable, Callable, Collection, Iterable, Iterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from tqdm.auto import tqdm

import agentrl
from agentrl.client.dataset import content_digest, repeated_id
from agentrl.client.pipeline import train_pipelined
from agentrl.data.trajectory import Trajectory
from agentrl.data.trajectory_group import TrajectoryGroup
from agentrl.foundation.errors import ConfigurationError
from agentrl.records.scenario_record import scenario_key

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
        num_rollout_workers: int | None = None,
        min_batch_size: int | None = None,
        max_batch_size: int | None = None,
        max_steps_off_policy: int | None = 4,
        queue_maxsize: int | None = None,
        pipeline: PipelineRuntimeConfig | None = None,
        autotune: PipelineAutotuneConfig | None = None,
        grad_accumulation_sequences: int | None = None,
        limit_mean_steps_off_policy: float | None = None,
        score_reference_groups_per_step: float | None = None,
        score_reference_rollouts_per_group: float | None = None,
        optimizer_save_interval: int = 5,
        rollout_executor: Any = None,
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
        pipeline = _runtime_config(pipeline, num_rollout_workers=num_rollout_workers, min_batch_size=min_batch_size,
                                   max_batch_size=max_batch_size, queue_maxsize=queue_maxsize)  # fmt: skip
        _refuse_unhonoured(
            autotune=autotune,
            limit_mean_steps_off_policy=limit_mean_steps_off_policy,
            rollout_executor=rollout_executor,
            grad_accumulation_sequences=grad_accumulation_sequences,
            optimizer_save_interval=optimizer_save_interval,
        )
        min_batch_size, num_rollout_workers = pipeline.min_batch_size, pipeline.num_rollout_workers
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
        self.pipeline = pipeline
        # ART's None: no staleness limit. agentrl samples ahead as far as the rollout workers reach, and drops nothing.
        self.drop_stale = max_steps_off_policy is not None
        self.max_steps_off_policy = (
            max_steps_off_policy
            if max_steps_off_policy is not None
            else max(1, -(-num_rollout_workers // min_batch_size))
        )
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
                drop_stale=self.drop_stale,
            )
        if not self.results:
            logger.info("PipelineTrainer: nothing to train (resumed at step %d, %d scenarios read)", start, source.read)
        return self.results


class PipelineRuntimeConfig(BaseModel):
    """ART 0.5.20+'s `pipeline=` settings: rollout workers (concurrent rollouts) and the groups a step trains on
    (`min_batch_size`; agentrl's steps take exactly that many). The queue and score-reference keys only size ART's
    queue and status line, and are accepted."""

    model_config = ConfigDict(extra="forbid")

    num_rollout_workers: int = Field(default=16, ge=1)
    min_batch_size: int = Field(default=4, ge=1)
    max_batch_size: int | None = Field(default=None, ge=1)
    queue_maxsize: int | None = Field(default=None, ge=1)
    score_reference_groups_per_step: float | None = Field(default=8.0, gt=0.0)
    score_reference_rollouts_per_group: float | None = Field(default=None, gt=0.0)

    @model_validator(mode="after")
    def _batch_bounds(self) -> PipelineRuntimeConfig:
        if self.max_batch_size is not None and self.max_batch_size < self.min_batch_size:
            raise ValueError(f"max_batch_size {self.max_batch_size} is below min_batch_size {self.min_batch_size}")
        return self


class PipelineAutotuneConfig(BaseModel):
    """ART 0.5.20+'s pipeline autotuner settings: agentrl runs with `mode="off"` only (ART's default); the tuner's
    other keys are kept and change nothing while it is off."""

    model_config = ConfigDict(extra="allow")

    mode: Literal["off", "online", "profile"] = "off"
    profile: str | None = None
    output_name: str = "latest"


def _runtime_config(pipeline: PipelineRuntimeConfig | None, **deprecated: int | None) -> PipelineRuntimeConfig:
    """`pipeline=`, or ART's deprecated direct keywords (a DeprecationWarning, as ART's); both at once raise."""
    given = {key: value for key, value in deprecated.items() if value is not None}
    if pipeline is not None and given:
        raise ConfigurationError(
            f"PipelineTrainer got pipeline= and the deprecated keywords {sorted(given)}: set them in "
            "PipelineRuntimeConfig only"
        )
    if pipeline is not None:
        return pipeline
    if given:
        warnings.warn(
            f"PipelineTrainer keywords {sorted(given)} are deprecated (ART 0.5.20+): pass "
            "pipeline=PipelineRuntimeConfig(...)",
            DeprecationWarning,
            stacklevel=3,
        )
    try:
        return PipelineRuntimeConfig(**given)
    except ValidationError as error:
        raise ConfigurationError(f"PipelineTrainer: {error.errors()[0]['msg']}") from None


def _refuse_unhonoured(
    *,
    autotune: PipelineAutotuneConfig | None,
    limit_mean_steps_off_policy: float | None,
    rollout_executor: Any,
    grad_accumulation_sequences: int | None,
    optimizer_save_interval: int,
) -> None:
    """ART 0.5.20+'s PipelineTrainer keywords agentrl has no counterpart for: accepted at ART's default, else a
    `ConfigurationError` naming the keyword and what to do."""
    if autotune is not None and autotune.mode != "off":
        raise ConfigurationError(
            f"PipelineTrainer(autotune=PipelineAutotuneConfig(mode={autotune.mode!r})): agentrl has no pipeline "
            "autotuner (it tunes ART's packing and vLLM load); set num_rollout_workers and min_batch_size yourself"
        )
    if limit_mean_steps_off_policy is not None:
        raise ConfigurationError(
            "PipelineTrainer(limit_mean_steps_off_policy=...) has no counterpart: agentrl bounds each group's "
            "staleness with max_steps_off_policy (a group staler than it is dropped)"
        )
    if rollout_executor is not None:
        raise ConfigurationError(
            "PipelineTrainer(rollout_executor=...) has no counterpart: rollouts run as tasks on the event loop, "
            "num_rollout_workers at a time"
        )
    if grad_accumulation_sequences not in (None, 1):
        raise ConfigurationError(
            f"PipelineTrainer(grad_accumulation_sequences={grad_accumulation_sequences!r}): ART's LocalBackend takes "
            "only 1, one optimizer step per trajectory, as agentrl.art does"
        )
    if (
        isinstance(optimizer_save_interval, bool)
        or not isinstance(optimizer_save_interval, int)
        or optimizer_save_interval < 1
    ):
        raise ConfigurationError(f"optimizer_save_interval must be an int >= 1, got {optimizer_save_interval!r}")


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
