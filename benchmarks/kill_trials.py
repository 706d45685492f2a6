"""Kill -9 trials: a run killed at a random moment and resumed trains every scheduled scenario exactly once.

    .venv/bin/python -m benchmarks.kill_trials [--trials 2] [--scenarios 24]

Each trial trains `--scenarios` larger-number scenarios, 3 a step in groups of 4, on the packaged model
behind the real server, in a child process that resumes from the run's record
(`iterate_dataset(already_trained=model.trained_scenarios())`). The parent SIGKILLs the child at a random
moment after its first step starts (sampling, training, saving or swapping: wherever it is), then starts
it again until it finishes, and checks the record: every scenario consumed by exactly one committed step.
Synchronous loop and `train_pipelined` (one step ahead: a killed step's look-ahead groups in flight); and
"at-commit", a synchronous run that kills itself at the worst moment for its records: just after its first
trained step's checkpoint is committed and served, before the step's metrics line, trajectories and transcript
are written. Every trial also checks that each committed step has its metrics line and trajectories.
Writes benchmarks/results/kill_trials.json; timings are this machine's and include each restart's server start.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import agentrl
from agentrl.client.dataset import content_ids
from agentrl.foundation.files import write_json_atomic
from agentrl.foundation.openmp_spin import with_spin_bounded
from agentrl_environments.larger_number.task import rollout, scenarios
from benchmarks.step_breakdown import RESULTS, cpu_name, precision_label

KILL_RESULTS = RESULTS.with_name("kill_trials.json")
PER_STEP, GROUP_SIZE = 3, 4


async def child(base_path: str, mode: str, count: int) -> None:
    """Train every scenario not yet trained, printing a line per step and the record at the end."""
    if mode == "at-commit":
        die_at_the_commit()
    model = agentrl.TrainableModel(name="killed", project="trials", base_path=base_path)
    backend = agentrl.LocalBackend()
    await model.register(backend)
    batches = list(
        agentrl.iterate_dataset(
            scenarios("train", count, seed=7),
            batch_size=PER_STEP,
            already_trained=model.trained_scenarios(),
            show_progress=False,
        )
    )
    print(f"RESUMED {model.step} {sum(len(b.keys) for b in batches)}", flush=True)

    def groups_of(batch: agentrl.DatasetBatch[Any]) -> list[agentrl.TrajectoryGroup]:
        return batch.groups(lambda s: agentrl.TrajectoryGroup(rollout(model, s) for _ in range(GROUP_SIZE)))

    config = agentrl.TrainConfig(learning_rate=1e-4, truncated_importance_sampling=2.0)
    if mode == "pipelined" and batches:
        first = model.step
        await agentrl.train_pipelined(
            model,
            lambda m, step: groups_of(batches[step - first]),
            steps=len(batches),
            max_steps_off_policy=1,
            config=config,
            on_step=lambda r: print(f"STEP {r.step}", flush=True),
        )
    else:
        for batch in batches:
            groups = await agentrl.gather_trajectory_groups(groups_of(batch), show_progress=False)
            result = await model.train(groups, config)
            print(f"STEP {result.step}", flush=True)
    print("DONE " + json.dumps(model.trained_scenarios()), flush=True)
    await backend.close()


def die_at_the_commit() -> None:
    """SIGKILL this process when its first trained step is committed and served, before its records are written."""
    from agentrl.backend.session import ModelSession

    record = ModelSession.record

    async def record_or_die(
        self: ModelSession, groups: list[Any], line: dict[str, float], *, step: int, split: str
    ) -> None:
        if split == "train" and line.get("skipped") is False:
            print(f"KILLED AT COMMIT {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        await record(self, groups, line, step=step, split=split)

    ModelSession.record = record_or_die  # type: ignore[method-assign]


def records_complete(run_dir: str) -> dict[str, Any]:
    """Whether every committed step past 0 has its train line in metrics.jsonl and its trajectories; which were back-filled."""
    from pathlib import Path

    from agentrl.records.run_folder import RunFolder
    from agentrl.records.tracking import read_metrics

    folder = RunFolder(Path(run_dir))
    lines = {r["step"]: r for r in read_metrics(folder.path) if r.get("split") == "train" and not r.get("skipped")}
    steps = [step for step in folder.checkpoints.steps() if step > 0]
    missing = [step for step in steps if step not in lines or not folder.trajectories("train", step).exists()]
    return {"steps": steps, "missing": missing, "backfilled": [s for s in steps if lines.get(s, {}).get("backfilled")]}


def attempt(base_path: str, mode: str, count: int, kill_after_s: float | None) -> dict[str, Any]:
    """Run the child once; with `kill_after_s`, SIGKILL it that long after it resumed (if still running)."""
    # A pipelined child's server samples while its trainer steps: OpenMP's spin bounded (agentrl.foundation.openmp_spin).
    env = with_spin_bounded(os.environ) if mode == "pipelined" else None
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.kill_trials", "--child", base_path, mode, str(count)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    stamped: list[tuple[float, str]] = []  # (when it arrived, line): when the child resumed and finished
    resumed = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            stamped.append((time.monotonic(), line.strip()))
            if line.startswith("RESUMED"):
                resumed.set()
        resumed.set()  # it ended without resuming

    def first(prefix: str) -> tuple[float, str] | None:
        return next(((at, line) for at, line in stamped if line.startswith(prefix)), None)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    killed_at_s = None
    if kill_after_s is not None:
        resumed.wait()
        if (resumed_line := first("RESUMED")) is not None:
            time.sleep(max(0.0, resumed_line[0] + kill_after_s - time.monotonic()))
            if process.poll() is None:
                process.kill()  # SIGKILL: no cleanup runs; its server and ranks notice and stop
                killed_at_s = round(time.monotonic() - resumed_line[0], 1)
    process.wait()
    reader.join()
    resumed_line, done_line = first("RESUMED"), first("DONE ")
    return {
        "seconds": round(time.monotonic() - started, 1),
        "killed_after_s": killed_at_s,
        "resumed": resumed_line[1] if resumed_line else None,
        "steps_committed": [line for _, line in stamped if line.startswith("STEP")],
        "killed_itself": next((line for _, line in stamped if line.startswith("KILLED")), None),
        "trained": json.loads(done_line[1][5:]) if done_line else None,
        "ran_s": round(done_line[0] - resumed_line[0], 1) if done_line and resumed_line else None,
    }


def trial(
    mode: str, count: int, rng: random.Random, kill_window_s: tuple[float, float] | None = None
) -> dict[str, Any]:
    """Train `count` scenarios in `mode`, SIGKILLed at a moment drawn from `kill_window_s` after it started
    (default: 3 s to 3 s times `count`; steps of 3 take ~10 s on a float32 CPU: mid-run), then resumed until done.
    "at-commit" kills itself at its first trained step's commit (`die_at_the_commit`) and resumes synchronously.

    A draw past the end of the run (a faster machine than the window assumed) is drawn again, on a fresh
    run, within the time the run took, so the kill lands while it works; those draws are kept in `missed`."""
    low_s, high_s = kill_window_s or (3.0, 3.0 * count)
    missed: list[dict[str, float]] = []
    kill_after_s: float | None = None
    with tempfile.TemporaryDirectory(prefix="kill-trial-") as folder:
        if mode == "at-commit":
            base_path = f"{folder}/0"
            attempts = [attempt(base_path, mode, count, None)]
        for number in range(0 if mode == "at-commit" else 3):
            base_path = f"{folder}/{number}"
            kill_after_s = round(rng.uniform(low_s, high_s), 1)
            attempts = [attempt(base_path, mode, count, kill_after_s)]
            ran_s = attempts[0]["ran_s"]
            if attempts[0]["trained"] is None or ran_s is None:
                break
            missed.append({"kill_after_s": kill_after_s, "ran_s": ran_s})
            high_s = 0.8 * ran_s
            low_s = min(low_s, high_s / 2)
        while attempts[-1]["trained"] is None and len(attempts) < 4:
            attempts.append(attempt(base_path, "synchronous" if mode == "at-commit" else mode, count, None))
        trained = attempts[-1]["trained"] or {}
        expected = {f"0:{i}" for i in content_ids(scenarios("train", count, seed=7))}
        exactly_once = set(trained) == expected and all(len(steps) == 1 for steps in trained.values())
        return {
            "mode": mode,
            "kill_after_s": kill_after_s,
            "missed": missed,
            "exactly_once": exactly_once,
            "records": records_complete(f"{base_path}/trials/killed"),
            "attempts": attempts,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=2, help="trials per mode")
    parser.add_argument("--scenarios", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--child", nargs=3, metavar=("BASE_PATH", "MODE", "COUNT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        asyncio.run(child(args.child[0], args.child[1], int(args.child[2])))
        return
    rng = random.Random(args.seed)
    trials = []
    for mode in ("synchronous", "pipelined", "at-commit"):
        for number in range(args.trials):
            result = trial(mode, args.scenarios, rng)
            trials.append(result)
            kill = result["attempts"][0]["killed_after_s"]
            print(
                f"{mode} trial {number + 1}: killed {kill} s after it resumed, "
                f"{len(result['attempts'])} attempts, exactly once: {result['exactly_once']}, "
                f"steps without records: {result['records']['missing']}",
                flush=True,
            )
    write_json_atomic(
        KILL_RESULTS,
        {
            "date": datetime.date.today().isoformat(),
            "cpu": cpu_name(),
            "precision": precision_label(),
            "scenarios": args.scenarios,
            "per_step": PER_STEP,
            "group_size": GROUP_SIZE,
            "trials": trials,
        },
    )
    print(
        f"all exactly once: {all(t['exactly_once'] for t in trials)}; every step's records: "
        f"{not any(t['records']['missing'] for t in trials)}; wrote {KILL_RESULTS}"
    )


if __name__ == "__main__":
    main()
