"""Why a rubric-task run did or did not learn: the training signal step by step, from its run folder.

    .venv/bin/python -m benchmarks.rubric_signal RUN_FOLDER [RUN_FOLDER ...]

Per training step: the reward's mean, the code-checked pass rate beside it (for a judged run, the gap
between the two is the judge being gamed), the share of groups whose rewards were all equal (no
gradient), the mean spread of rewards within a group, the answers' length in words, and the pass rate
of each kind of code check (which rubric items the policy ever changes). Held out, the same per kind
before and after. `benchmarks.learning` stores this beside each rubric row.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from agentrl.data.trajectory import Trajectory
from agentrl.data.trajectory_group import TrajectoryGroup
from agentrl.judges.agreement import pair_counts
from agentrl.records.run_folder import RunFolder, parse_record_stem
from agentrl.records.tracking import load_trajectories
from agentrl_environments.rubric.env import load_tasks
from agentrl_environments.rubric.tasks import InstructionTask, passes, words


def tasks_by_id() -> dict[str, InstructionTask]:
    return {t.task_id: t for split in ("train", "test") for t in load_tasks(split=split)}


def answer(trajectory: Trajectory) -> str:
    return str(trajectory.messages()[-1].get("content") or "")


def kind_pass_rates(trajectories: list[Trajectory], tasks: dict[str, InstructionTask]) -> dict[str, float]:
    """Per code-check kind (contains, max_words, bullets, sentences): the share of those checks passed."""
    results: dict[str, list[bool]] = defaultdict(list)
    for t in trajectories:
        task = tasks.get(str(t.metadata.get("task_id")))
        for check in (task.checks or []) if task else []:
            if check is not None:
                results[check.kind].append(passes(check, answer(t)))
    return {kind: round(statistics.fmean(r), 3) for kind, r in sorted(results.items())}


def mean(values: list[float]) -> float | None:
    return round(statistics.fmean(values), 3) if values else None


def pairwise_agreement(groups: list[TrajectoryGroup]) -> float | None:
    """Over pairs in a group whose code-checked pass rates differ: the share the reward orders the same way
    (a tie in reward counts half). 1.0 for a run trained on the checks; for a judged run, the judge's agreement
    with the checks on the policy's own answers at that step."""
    counts = [
        pair_counts([float(t.metrics["independent_reward"]) for t in scored], [float(t.reward or 0.0) for t in scored])
        for group in groups
        if (scored := [t for t in group.trajectories if t.reward is not None and "independent_reward" in t.metrics])
    ]
    pairs = sum(c.pairs for c in counts)
    return round(sum(c.credit for c in counts) / pairs, 3) if pairs else None


def step_signal(groups: list[TrajectoryGroup], tasks: dict[str, InstructionTask]) -> dict[str, Any]:
    """One step's groups: reward and checked pass rate, groups without signal, spread within a group, length."""
    trajectories = [t for g in groups for t in g.trajectories]
    rewarded = [[t.reward for t in g.trajectories if t.reward is not None] for g in groups]
    rewarded = [r for r in rewarded if len(r) > 1]
    return {
        "reward": mean([r for g in rewarded for r in g]),
        "checked": mean(
            [float(t.metrics["independent_reward"]) for t in trajectories if "independent_reward" in t.metrics]
        ),
        "judge_check_agreement": pairwise_agreement(groups),
        "zero_variance_groups": mean([float(max(r) == min(r)) for r in rewarded]),
        "within_group_std": mean([statistics.pstdev(r) for r in rewarded]),
        "words": mean([float(words(answer(t))) for t in trajectories]),
        "by_check": kind_pass_rates(trajectories, tasks),
    }


def signal(run_dir: Path) -> dict[str, Any]:
    """The run's training steps in order, and its held-out check kinds at the first and last evaluation."""
    folder, tasks = RunFolder(run_dir), tasks_by_id()
    steps = sorted({parse_record_stem(p.stem)[1] for p in folder.trajectory_files("train")})
    evaluations = sorted({parse_record_stem(p.stem)[1] for p in folder.trajectory_files("val")})
    held_out = {
        step: [t for g in load_trajectories(folder.trajectories("val", step)) for t in g.trajectories]
        for step in (evaluations[:1] + evaluations[-1:])
    }
    return {
        "train": {step: step_signal(load_trajectories(folder.trajectories("train", step)), tasks) for step in steps},
        "held_out_by_check": {step: kind_pass_rates(ts, tasks) for step, ts in held_out.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", type=Path)
    for run_dir in parser.parse_args().run_dirs:
        json.dump({str(run_dir): signal(run_dir)}, sys.stdout, indent=1)
        print()


if __name__ == "__main__":
    main()
