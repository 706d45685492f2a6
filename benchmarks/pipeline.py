"""Synchronous vs pipelined training on the main job's task: steps per hour, held-out reward, idle time.

    .venv/bin/python -m benchmarks.pipeline [--steps 12] [--eval-every 4]
    .venv/bin/python -m benchmarks.pipeline --spread    # held-out reward only, per loss setting


Same task (larger-number), model, sizes (8 groups of 8 a step), learning rate and scenarios for
each mode: the synchronous loop, then `train_pipelined` with `max_steps_off_policy` 1 and 2
(truncated importance sampling at 2). Training is timed alone; held-out reward is measured after
each run on its saved checkpoints (every `--eval-every` steps), so evaluation never pauses a run.
A timeline model then predicts the pipelined gain when sampling and training have their own
devices, from the synchronous run's measured per-phase times. Writes
benchmarks/results/pipeline.json and its table in the docs.

`--spread` asks whether pipelining costs reward: one more run of each loop with and without
truncated importance sampling, held-out reward at the start and the end only (its step times are
not comparable: use the main mode for those). Writes benchmarks/results/pipeline_spread.json.

Every mode runs in one process, so all run with OpenMP's spin bounded (GOMP_SPINCOUNT=2000, set here before
torch loads unless given), as a pipelined CPU run must (agentrl.foundation.openmp_spin); the synchronous loop alone
runs faster without the bound.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import statistics
import tempfile
import time
from typing import Any

from agentrl.foundation.openmp_spin import bound_openmp_spinning

bound_openmp_spinning()  # before anything loads torch: the pipelined modes share the cores with the server

import agentrl  # noqa: E402 - after the spin bound
from agentrl.foundation.files import write_json_atomic  # noqa: E402
from agentrl.records.step_metrics import summarize  # noqa: E402
from agentrl_environments.larger_number.task import evaluate, rollout, scenarios  # noqa: E402
from agentrl_environments.larger_number.train import GROUP_SIZE, GROUPS_PER_STEP, LEARNING_RATE  # noqa: E402
from benchmarks.pipeline_spread import SPREAD_END, SPREAD_START, spread_table  # noqa: E402
from benchmarks.readme import replace_section  # noqa: E402
from benchmarks.step_breakdown import RESULTS, machine_label  # noqa: E402

PIPELINE_RESULTS = RESULTS.with_name("pipeline.json")
SPREAD_RESULTS = RESULTS.with_name("pipeline_spread.json")
SPREAD_VARIANTS = ((1, 0.0), (1, 2.0), (None, 0.0), (None, 2.0))
"""(max_steps_off_policy, truncated_importance_sampling) of each `--spread` run; None: synchronous."""
START, END = "<!-- benchmark:pipeline:start -->", "<!-- benchmark:pipeline:end -->"
TARGET_REWARD = 0.8
TRAIN_PHASES = ("tokenize_s", "train_s", "save_s", "swap_s")


async def run_mode(
    max_steps_off_policy: int | None, steps: int, eval_every: int, truncated_importance_sampling: float | None = None
) -> dict[str, Any]:
    """Train `steps` steps in one mode (None: synchronous) on a fresh run, then evaluate its checkpoints.

    `truncated_importance_sampling` None is each mode's recommended setting: off when synchronous, 2 pipelined."""
    if truncated_importance_sampling is None:
        truncated_importance_sampling = 0.0 if max_steps_off_policy is None else 2.0
    config = agentrl.TrainConfig(
        learning_rate=LEARNING_RATE, truncated_importance_sampling=truncated_importance_sampling
    )
    train = scenarios("train", steps * GROUPS_PER_STEP, seed=1)
    test = scenarios("test", 128)

    def make_groups(model: agentrl.TrainableModel, step: int) -> list[agentrl.TrajectoryGroup]:
        batch = train[step * GROUPS_PER_STEP :][:GROUPS_PER_STEP]
        return [agentrl.TrajectoryGroup(rollout(model, s) for _ in range(GROUP_SIZE)) for s in batch]

    label = "synchronous" if max_steps_off_policy is None else f"pipelined, max_steps_off_policy={max_steps_off_policy}"
    label += f", TIS {truncated_importance_sampling:g}" if truncated_importance_sampling else ""
    with tempfile.TemporaryDirectory() as tmp:
        model = agentrl.TrainableModel(name="bench", project="pipeline", base_path=tmp)
        backend = agentrl.LocalBackend()
        try:
            await model.register(backend)
            finished_at: list[float] = []
            rollout_s: list[float] = []
            results: list[agentrl.TrainResult] = []
            started = time.perf_counter()
            if max_steps_off_policy is None:
                for step in range(steps):
                    sampled = time.perf_counter()
                    groups = await agentrl.gather_trajectory_groups(make_groups(model, step), show_progress=False)
                    rollout_s.append(time.perf_counter() - sampled)
                    results.append(await model.train(groups, config))
                    finished_at.append(time.perf_counter() - started)
            else:
                results = await agentrl.train_pipelined(
                    model,
                    make_groups,
                    steps=steps,
                    max_steps_off_policy=max_steps_off_policy,
                    config=config,
                    on_step=lambda result: finished_at.append(time.perf_counter() - started),
                )
            wall_s = time.perf_counter() - started
            rewards = {}
            for step in [0, *range(eval_every, steps + 1, eval_every)]:
                name = f"eval-{step}@{step}"
                await backend.server.load_adapter(name, backend.session(model).store.path(step))
                endpoint = backend.endpoint(model)  # the gateway's sampling token
                judged = agentrl.Model(name=name, base_url=endpoint.base_url, api_key=endpoint.api_key)
                rewards[step] = summarize(await evaluate(judged, test))["reward_mean"]
                await backend.server.unload_adapter(name)
                print(f"{label}: held-out reward at step {step}: {rewards[step]:.3f}", flush=True)
        finally:
            await backend.close()
    reached = [s for s, r in sorted(rewards.items()) if r >= TARGET_REWARD]
    per_step = [r.metrics for r in results]

    def mean_of(key: str) -> float | None:
        values = [m[key] for m in per_step if key in m]
        return statistics.fmean(values) if values else None

    return {
        "mode": label,
        "max_steps_off_policy": max_steps_off_policy,
        "steps": steps,
        "wall_s": wall_s,
        "steps_per_hour": 3600 * steps / wall_s,
        "held_out_reward": rewards,
        "seconds_to_reward_0.8": finished_at[reached[0] - 1] if reached and reached[0] > 0 else None,
        "staleness_mean": mean_of("staleness_mean"),
        "staleness_max": max((m.get("staleness_max", 0.0) for m in per_step), default=0.0),
        "groups_stale_dropped": sum(m.get("num_groups_stale_dropped", 0.0) for m in per_step),
        "trainer_idle_frac": mean_of("trainer_idle_frac"),
        "sampler_idle_frac": mean_of("sampler_idle_frac"),
        "rollout_s_per_step": statistics.fmean(rollout_s) if rollout_s else None,
        "train_s_per_step": statistics.fmean(sum(m.get(k, 0.0) for k in TRAIN_PHASES) for m in per_step),
    }


def timeline_model(sync: dict[str, Any]) -> dict[str, Any]:
    """Predicted pipelined gain with sampling and training on their own devices, from measured phase times.

    Assumptions: sampling runs as fast while the trainer trains as it does alone (its own device);
    with max_steps_off_policy >= 1 a step's sampling overlaps the previous step's training, so a step
    takes max(sampling, training) instead of their sum; the swap is part of training; staleness
    does not change how much a step learns (truncated importance sampling corrects it).
    """
    rollout_s, train_s = sync["rollout_s_per_step"], sync["train_s_per_step"]
    return {
        "rollout_s": rollout_s,
        "train_s": train_s,
        "synchronous_step_s": rollout_s + train_s,
        "pipelined_step_s": max(rollout_s, train_s),
        "predicted_gain": (rollout_s + train_s) / max(rollout_s, train_s),
    }


def fmt(value: float | None, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--eval-every", type=int, default=4)
    parser.add_argument("--spread", action="store_true", help="held-out reward per loop and loss setting")
    args = parser.parse_args()
    if args.spread:
        spread = [asyncio.run(run_mode(off, args.steps, args.steps, tis)) for off, tis in SPREAD_VARIANTS]
        keep = ("mode", "max_steps_off_policy", "steps", "held_out_reward", "staleness_mean")
        runs = [{key: run[key] for key in keep} for run in spread]
        spread_results = {"machine": machine_label(), "date": datetime.date.today().isoformat(), "runs": runs}
        write_json_atomic(SPREAD_RESULTS, spread_results)
        replace_section(SPREAD_START, SPREAD_END, spread_table(spread_results))
        for run in runs:
            print(run)
        return
    runs = [asyncio.run(run_mode(mode, args.steps, args.eval_every)) for mode in (None, 1, 2)]
    model = timeline_model(runs[0])
    result = {
        "machine": machine_label(),
        "date": datetime.date.today().isoformat(),
        "runs": runs,
        "timeline_model": model,
        "timeline_assumptions": " ".join(timeline_model.__doc__.split("\n\n")[1].split()),
    }
    write_json_atomic(PIPELINE_RESULTS, result)
    sync_rate = runs[0]["steps_per_hour"]
    rows = [
        f"| {r['mode']} | {r['steps_per_hour']:.0f} ({r['steps_per_hour'] / sync_rate:.2f}x) | "
        f"{r['held_out_reward'][max(r['held_out_reward'])]:.3f} | {fmt(r['seconds_to_reward_0.8'], '{:.0f} s')} | "
        f"{fmt(r['staleness_mean'], '{:.2f}')} / {r['staleness_max']:.0f} | {r['groups_stale_dropped']:.0f} | "
        f"{fmt(r['trainer_idle_frac'], '{:.0%}')} | {fmt(r['sampler_idle_frac'], '{:.0%}')} |"
        for r in runs
    ]
    table = "\n".join(
        [
            START,
            f"Synchronous vs pipelined, main job's task, {GROUPS_PER_STEP}x{GROUP_SIZE} rollouts a step, "
            f"{args.steps} steps, {result['machine']}, {result['date']}:",
            "",
            "| mode | steps/hour | held-out reward at the end | time to 0.8 | staleness mean / max | stale groups "
            "dropped | trainer idle | sampler idle |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
            *rows,
            "",
            f"Timeline model (own devices for sampling and training; measured here: {model['rollout_s']:.1f} s sampling "
            f"and {model['train_s']:.1f} s training a step): a pipelined step takes max of the two instead of their sum, "
            f"a predicted **{model['predicted_gain']:.2f}x** steps/hour. Assumptions in `benchmarks/results/pipeline.json`.",
            END,
        ]
    )
    replace_section(START, END, table)
    print(table)


if __name__ == "__main__":
    main()
