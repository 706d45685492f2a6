"""ART's `art.pipeline_trainer.PipelineTrainer`, on `agentrl.train_pipelined`: rollouts for the next
steps sample while a step trains, at most `max_steps_off_policy` steps behind the served adapter.

Each step trains on `min_batch_size` groups, one per scenario (`rollout_fn(model, scenario, config)`
returns the group). `eval_fn(model, step, config)` runs at the start and every `eval_every_n_steps`,
and its trajectories are logged as "val". With `resume`, a run continues with the scenarios no committed
step consumed (the run's record, `TrainableModel.trained_scenarios`), so a crash repeats or skips none.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable
from typing import Any

import agentrl
from agentrl.errors import ConfigurationError
from agentrl.pipeline import train_pipelined
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
        adam_params: dict[str, Any] | None = None,
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
        })  # fmt: skip
        self.model, self.backend, self.rollout_fn, self.scenarios = model, backend, rollout_fn, scenarios
        self.config, self.eval_fn = config, eval_fn
        self.min_batch_size, self.max_steps, self.total_scenarios = min_batch_size, max_steps, total_scenarios
        self.max_steps_off_policy = max_steps_off_policy
        self.eval_every_n_steps, self.eval_at_start, self.resume = eval_every_n_steps, eval_at_start, resume
        self._workers = asyncio.Semaphore(num_rollout_workers)
        self.results: list[agentrl.TrainResult] = []

    async def _scenario_list(self) -> list[Any]:
        if isinstance(self.scenarios, AsyncIterable):
            return [s async for s in self.scenarios]
        return list(self.scenarios)

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

    async def train(self) -> list[agentrl.TrainResult]:
        """Train until the scenarios (or `max_steps`) run out; returns each step's result."""
        if not self.model.registered:
            await self.model.register(self.backend)
        scenarios = await self._scenario_list()
        if self.total_scenarios is not None:
            scenarios = scenarios[: self.total_scenarios]
        start = await self.model.get_step()
        batches = (
            list(
                agentrl.iterate_dataset(
                    scenarios,
                    batch_size=self.min_batch_size,
                    shuffle=False,
                    already_trained=self.model.trained_scenarios() if self.resume else (),
                    show_progress=False,
                )
            )
            if scenarios
            else []
        )
        steps = len(batches)
        if self.max_steps is not None:
            steps = min(steps, max(self.max_steps - start, 0))
        if self.eval_at_start:
            await self._evaluate(start)
        if steps == 0:
            logger.info("PipelineTrainer: nothing to train (%d scenarios, resumed at step %d)", len(scenarios), start)
            return []

        def make_groups(model: agentrl.TrainableModel, step: int) -> list[TrajectoryGroup]:
            return batches[step - start].groups(lambda scenario: TrajectoryGroup([self._rollout(scenario)]))

        async def on_step(result: agentrl.TrainResult) -> None:
            if self.eval_every_n_steps > 0 and result.step % self.eval_every_n_steps == 0:
                await self._evaluate(result.step)

        self.results = await train_pipelined(
            self.model,
            make_groups,
            steps=steps,
            max_steps_off_policy=self.max_steps_off_policy,
            config=self.train_config,
            on_step=on_step,
        )
        return self.results
