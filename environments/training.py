"""The loop every environment's training entry point runs: evaluate, train N steps, evaluate again.

An environment supplies three things: how to make a step's groups, how to evaluate a model on its
held-out set, and the sizes. Everything else (serving, progress, resuming) is agentrl's.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

import agentrl
from agentrl.gather import AfterEach
from agentrl.tracking import summarize

MakeGroups = Callable[[agentrl.TrainableModel, int], Iterable[agentrl.TrajectoryGroup]]
Evaluate = Callable[[agentrl.Model], Awaitable[list[agentrl.Trajectory]]]
WarmStart = Callable[[agentrl.TrainableModel], Awaitable[None]]


@dataclass(frozen=True)
class RunSummary:
    """Held-out metrics before and after, and where the run lives."""

    start_step: int
    end_step: int
    before: dict[str, float]
    after: dict[str, float]
    after_warm_start: dict[str, float] | None
    run_dir: str
    seconds: float


def fmt_metrics(metrics: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.3f}" for k, v in metrics.items() if k not in ("reward_std", "num_trajectories"))


async def train_and_evaluate(
    model: agentrl.TrainableModel,
    *,
    make_groups: MakeGroups,
    evaluate: Evaluate,
    steps: int,
    config: agentrl.TrainConfig,
    max_exception_rate: float = 0.1,
    after_each: AfterEach | None = None,
    warm_start: WarmStart | None = None,
) -> RunSummary:
    """Register `model`, evaluate it, train `steps` steps (resuming where it stopped), evaluate again.

    A model that is already registered keeps its backend (and it stays up afterwards); otherwise a
    LocalBackend is started and closed here. `warm_start` (e.g. supervised training on
    demonstrations) runs once, on a fresh run, before RL, and is followed by its own evaluation.
    `after_each` (e.g. a RULER judge) rescores each training group as it completes.
    """
    started = time.perf_counter()
    backend = None if model.registered else agentrl.LocalBackend()
    try:
        if backend is not None:
            print(f"Starting the vLLM server and the trainer for {model.base_model} ...")
            await model.register(backend)
        start_step = await model.get_step()
        before = await model.log(await evaluate(model), split="val")
        print(f"held-out at step {start_step}: {fmt_metrics(before)}")
        after_warm_start = None
        if warm_start is not None and start_step == 0:
            await warm_start(model)
            after_warm_start = await model.log(await evaluate(model), split="val")
            print(f"held-out after the warm start (step {await model.get_step()}): {fmt_metrics(after_warm_start)}")
        for step in range(await model.get_step(), start_step + steps + (after_warm_start is not None)):
            step_started = time.perf_counter()
            groups = await agentrl.gather_trajectory_groups(
                make_groups(model, step),
                max_exception_rate=max_exception_rate,
                after_each=after_each,
                desc=f"step {step + 1} rollouts",
            )
            result = await model.train(groups, config)
            m = result.metrics
            print(
                f"step {result.step}: reward {m['reward_mean']:.3f} ± {m['reward_std']:.3f}, "
                f"zero-variance groups {m.get('frac_zero_variance_groups', 0):.0%}, trained tokens {m.get('trained_tokens', 0):.0f}, "
                f"kl(sampler||trainer) {m.get('kl_sampler_trainer', 0):.4f}, {time.perf_counter() - step_started:.1f} s"
                + (f" (skipped: {result.skip_reason})" if result.skipped else "")
            )
        end_step = await model.get_step()
        after = await model.log(await evaluate(model), split="val")
        print(f"\nheld-out at step {start_step}: {fmt_metrics(before)}")
        print(f"held-out at step {end_step}: {fmt_metrics(after)}")
        run_dir = model.run_dir.resolve()
        print(f"run folder: {run_dir}\nreward plot: {run_dir / 'reward.png'}")
        print(f"transcripts: {run_dir / 'transcripts' / f'val-{end_step:04d}.html'} (and one per step)")
        return RunSummary(
            start_step,
            end_step,
            before,
            after,
            after_warm_start,
            str(model.run_dir.resolve()),
            time.perf_counter() - started,
        )
    finally:
        if backend is not None:
            await backend.close()


async def evaluate_base_and_checkpoint(
    model: agentrl.TrainableModel, evaluate: Evaluate
) -> dict[str, dict[str, float]]:
    """Held-out metrics of the prompted base model and of `model`'s latest checkpoint, on one server."""
    backend = agentrl.LocalBackend()
    try:
        await model.register(backend)
        base = backend.base_model()
        results = {"base": summarize(await evaluate(base)), model.inference_name: summarize(await evaluate(model))}
        for label, metrics in results.items():
            print(f"{label}: {fmt_metrics(metrics)}")
        return results
    finally:
        await backend.close()
