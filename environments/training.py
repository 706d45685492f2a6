"""The loop every environment's training entry point runs: evaluate, train N steps, evaluate again.

An environment supplies three things: its training scenarios and how to make one scenario's group, how
to evaluate a model on its held-out set, and the sizes. Everything else (serving, progress, resuming
with every scenario trained exactly once) is agentrl's.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import agentrl
from agentrl import AfterEach, JudgeModel
from agentrl.judges import RUN_PREFIX, Readout, trained_judge
from agentrl.records import CheckpointStore, RunFolder, read_metrics, summarize

OFF_POLICY_TIS = 2.0
"""Truncated importance sampling for pipelined runs: an off-policy turn's weight is capped at 2x."""
DEFAULT_READOUT: Readout = "probabilities"
"""How the environments' RULER rewards read their judge (`agentrl train --judge-readout`): from next-token
probabilities, where the judge returns logprobs (a local server always does), else from JSON."""
MakeGroup = Callable[[agentrl.TrainableModel, Any], agentrl.TrajectoryGroup]
"""One scenario's group, its rollouts unstarted: `make_group(model, scenario)`."""
Evaluate = Callable[[agentrl.Model], Awaitable[list[agentrl.Trajectory]]]
WarmStart = Callable[[agentrl.TrainableModel], Awaitable[None]]
Item = TypeVar("Item")
PresetT = TypeVar("PresetT")


def with_overrides(preset: PresetT, steps: int | None, base_model: str | None) -> PresetT:
    """A preset dataclass with the command line's --steps and --model where given."""
    options: Any = preset
    overridden: PresetT = replace(
        options, steps=steps if steps is not None else options.steps, base_model=base_model or options.base_model
    )
    return overridden


def scheduled_batches(
    model: agentrl.TrainableModel, scenarios: list[Item], groups_per_step: int, steps: int
) -> list[agentrl.DatasetBatch[Item]]:
    """The next `steps` batches of `scenarios` (in order, epoch after epoch) that this run's committed steps
    did not consume, by the run's record: a crash neither repeats nor skips a scenario."""
    trained = model.trained_scenarios()
    epochs = math.ceil((len(trained) + steps * groups_per_step) / len(scenarios)) + 1
    batches = agentrl.iterate_dataset(
        scenarios,
        batch_size=groups_per_step,
        epochs=epochs,
        shuffle=False,
        already_trained=trained,
        show_progress=False,
    )
    return list(itertools.islice(batches, steps))


def judge_option(
    judge: str | None, *, base_path: str, base_model: str, ruler: bool, readout: Readout = DEFAULT_READOUT
) -> JudgeModel | None:
    """The command line's --judge: a litellm model id as given, `run:NAME` a judge trained with
    `agentrl judge train` (a `TrainableModel` that `train_and_evaluate` registers beside the policy),
    None the base model. A trained judge judges what it learned: RULER's task for a RULER reward (`ruler`),
    a rubric's Yes or No (`--kind rubric`) for the rubric reward; read the way it was trained to answer
    (`readout`); anything else is a ConfigurationError naming the fix."""
    if judge is None or not judge.startswith(RUN_PREFIX):
        return judge
    return trained_judge(
        judge, base_path=base_path, base_model=base_model, readout=readout, kind="ruler" if ruler else "rubric"
    )


def judge_for(model: agentrl.TrainableModel, judge: JudgeModel | None) -> JudgeModel:
    """The judge as given (`judge_option`), or the untrained base model on `model`'s own server (once registered)."""
    return judge or model.backend.base_model()


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


def print_step(result: agentrl.TrainResult) -> None:
    """One line per step: reward, signal, tokens, sampler/trainer gap, staleness and idle time (the loop's)."""
    m = result.metrics
    print(
        f"step {result.step}: reward {m['reward_mean']:.3f} ± {m['reward_std']:.3f}, "
        f"zero-variance groups {m.get('frac_zero_variance_groups', 0):.0%}, trained tokens {m.get('trained_tokens', 0):.0f}, "
        f"kl(sampler||trainer) {m.get('kl_sampler_trainer', 0):.4f}, "
        f"staleness {m['staleness_mean']:.2f} (max {m['staleness_max']:.0f}, dropped {m['num_groups_stale_dropped']:.0f}),"
        f" idle trainer {m['trainer_idle_frac']:.0%} sampler {m['sampler_idle_frac']:.0%}, {m['steps_per_hour']:.0f} steps/h"
        + (f", unparsed tool calls {m['tool_call_parse_failures']:.0f}" if "tool_call_parse_failures" in m else "")
        + (f" (skipped: {result.skip_reason})" if result.skipped else "")
    )


def fmt_metrics(metrics: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.3f}" for k, v in metrics.items() if k not in ("reward_std", "num_trajectories"))


RECORD_KEYS = ("time", "step", "split", "skipped", "backfilled", "reward", "reward_std_dev", "exception_rate")
"""A metrics line's bookkeeping and ART aliases: what `recorded_evaluation` leaves out of a held-out summary."""


def steps_done(model: agentrl.TrainableModel, groups_per_step: int) -> int:
    """The steps a run has taken, by its record of consumed scenarios ("{epoch}:{id}"): a batch a step trained on,
    or skipped for want of signal, counts; a warm start consumes none. Per epoch, as `iterate_dataset` batches."""
    per_epoch = collections.Counter(key.partition(":")[0] for key in model.trained_scenarios())
    return sum(math.ceil(count / groups_per_step) for count in per_epoch.values())


def recorded_evaluation(model: agentrl.TrainableModel, step: int) -> dict[str, float] | None:
    """The last held-out summary recorded at `step` (the weights a resumed run starts from), or None."""
    lines = [r for r in read_metrics(model.run_dir) if r.get("split") == "val" and r.get("step") == step]
    return {k: v for k, v in lines[-1].items() if k not in RECORD_KEYS} if lines else None


def say_what_was_kept(model: agentrl.TrainableModel, steps: int) -> None:
    """What an interrupted run leaves, and how to resume it."""
    latest = CheckpointStore(model.run_dir).latest_step()
    kept = f"its checkpoints up to step {latest}" if latest is not None else "no checkpoint yet"
    print(
        f"\nStopped. Kept: the run folder {model.run_dir.resolve()}, with {kept} and every committed step's metrics, "
        f"trajectories and transcripts. Run the same command again to resume: it trains the rest of the run's "
        f"{steps} steps, each scenario still once.",
        flush=True,
    )


async def train_batches(
    model: agentrl.TrainableModel,
    batches: list[agentrl.DatasetBatch[Any]],
    make_group: MakeGroup,
    config: agentrl.TrainConfig,
    max_exception_rate: float,
    after_each: AfterEach | None,
    max_steps_off_policy: int | None,
) -> None:
    """One step per batch on agentrl's training loop (`agentrl.train_pipelined`): synchronous, or with
    `max_steps_off_policy` set, the next steps' rollouts sampling while a step trains."""
    if max_steps_off_policy:
        if not config.truncated_importance_sampling:
            config = config.model_copy(update={"truncated_importance_sampling": OFF_POLICY_TIS})
        print(
            f"pipelined: rollouts run up to {max_steps_off_policy} step(s) ahead of the trainer "
            f"(truncated importance sampling at {config.truncated_importance_sampling:g})"
        )
    first = await model.get_step()
    await agentrl.train_pipelined(
        model,
        lambda model, step: batches[step - first].groups(lambda s: make_group(model, s)),
        steps=len(batches),
        max_steps_off_policy=max_steps_off_policy or 0,
        config=config,
        after_each=after_each,
        max_exception_rate=max_exception_rate,
        on_step=print_step,
    )


async def train_and_evaluate(
    model: agentrl.TrainableModel,
    *,
    scenarios: list[Any],
    groups_per_step: int,
    make_group: MakeGroup,
    evaluate: Evaluate,
    steps: int,
    config: agentrl.TrainConfig,
    max_exception_rate: float = 0.1,
    after_each: AfterEach | None = None,
    warm_start: WarmStart | None = None,
    max_steps_off_policy: int | None = None,
    judge: JudgeModel | None = None,
) -> RunSummary:
    """Register `model`, evaluate it, train until the run has taken `steps` steps of `groups_per_step` scenarios
    each (`steps_done`: a resumed run trains the rest, each scenario once per epoch: `scheduled_batches`),
    evaluate again. A resumed run's weights were evaluated when it stopped: that record
    is reused, not sampled again. Interrupted (Ctrl-C), it says what was kept and how to resume.

    A `judge` that is a `TrainableModel` (a trained judge, `judge_option`) is registered on the
    policy's backend and served at its checkpoint; nothing here trains it.

    With `max_steps_off_policy` set, the steps run pipelined (`agentrl.train_pipelined`): the next
    steps' rollouts sample while a step trains; None is the synchronous loop.

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
        if isinstance(judge, agentrl.TrainableModel) and not judge.registered:
            await judge.register(model.backend)
            print(f"judging with {judge.project}/{judge.name} at step {await judge.get_step()}, beside the policy")
        start_step = await model.get_step()
        if (before := recorded_evaluation(model, start_step)) is not None:
            print(f"held-out at step {start_step} (recorded when the run stopped there): {fmt_metrics(before)}")
        else:
            before = await model.log(await evaluate(model), split="val")
            print(f"held-out at step {start_step}: {fmt_metrics(before)}")
        after_warm_start = None
        if warm_start is not None and start_step == 0:
            await warm_start(model)
            after_warm_start = await model.log(await evaluate(model), split="val")
            print(f"held-out after the warm start (step {await model.get_step()}): {fmt_metrics(after_warm_start)}")
        done = steps_done(model, groups_per_step)
        if done:
            print(f"resuming: {done} of the run's {steps} steps done, {max(0, steps - done)} to train")
        batches = scheduled_batches(model, scenarios, groups_per_step, max(0, steps - done))
        await train_batches(model, batches, make_group, config, max_exception_rate, after_each, max_steps_off_policy)
        end_step = await model.get_step()
        after = before if end_step == start_step and not batches else None
        after = after or await model.log(await evaluate(model), split="val")
        print(f"\nheld-out at step {start_step}: {fmt_metrics(before)}")
        print(f"held-out at step {end_step}: {fmt_metrics(after)}")
        run_dir = model.run_dir.resolve()
        print(f"run folder: {run_dir}\nreward plot: {run_dir / 'reward.png'}")
        shown = RunFolder(run_dir).trajectory_files("val")[-1].stem  # the last evaluation's page
        print(f"transcripts: {run_dir / 'transcripts' / f'{shown}.html'} (and one per step)")
        return RunSummary(
            start_step,
            end_step,
            before,
            after,
            after_warm_start,
            str(model.run_dir.resolve()),
            time.perf_counter() - started,
        )
    except (asyncio.CancelledError, KeyboardInterrupt):
        say_what_was_kept(model, steps)
        raise
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
