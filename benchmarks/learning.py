"""Does training help, by more than noise? Each shipped environment's CPU preset, held-out before and after.

    .venv/bin/python -m benchmarks.learning [--only email-match email-ruler ...] [--list]

Every run trains from scratch (a fresh run folder) at its preset's full length and is evaluated on
its held-out set before training (the prompted base model, step 0) and after. The score is read
per held-out trajectory from the run's saved val trajectories, so the table gives each mean with
the standard error of the difference: paired where the held-out items carry an identity in their
metadata (the same question, task or game seed before and after: the SE of the per-item
differences, which leaves out how hard each item is), unpaired otherwise (sqrt(se_before^2 + se_after^2)). Email trained with
RULER is scored on the verifiable answer check, the same number as email trained on it. The rubric
task is scored twice: by the judge with reworded rubrics, and by code checks the judge never sees.
Results merge into benchmarks/results/learning.json (one entry per run, so runs can be redone one
at a time) and its table in the docs; the run folders stay under the cache (learning-runs/), for
`agentrl show` and `agentrl judge check`.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.backend.precision import cpu_has_native_bf16
from agentrl.data.trajectory import Trajectory
from agentrl.foundation.base_models import cache_dir
from agentrl.foundation.files import write_json_atomic
from agentrl.foundation.plugins import load_environment
from agentrl.records.run_folder import RunFolder, parse_record_stem
from agentrl.records.tracking import load_trajectories, read_metrics
from benchmarks import rubric_signal
from benchmarks.readme import replace_section
from benchmarks.step_breakdown import RESULTS, cpu_name

LEARNING_RESULTS = RESULTS.with_name("learning.json")
START, END = "<!-- benchmark:learning:start -->", "<!-- benchmark:learning:end -->"
Score = Callable[[Trajectory], float | None]


def reward(t: Trajectory) -> float | None:
    return t.reward


def metric(name: str) -> Score:
    return lambda t: float(t.metrics[name]) if name in t.metrics else None


@dataclass(frozen=True)
class LearningRun:
    """One environment trained one way, and the held-out numbers that say whether it learned."""

    env: str
    training_reward: str
    scores: dict[str, Score]
    options: dict[str, Any] = field(default_factory=dict)
    trained_judge: str | None = None
    """Judged by a judge trained with agentrl, served beside the policy: "ruler" (`--trained-judge RUN_FOLDER`)
    or "rubric" (a rubric judge trained on its verdicts, `--trained-rubric-judge RUN_FOLDER`)."""


RUNS = {
    "larger-number": LearningRun("larger-number", "verifiable", {"reward": reward}),
    "larger-number-ruler-trained-judge": LearningRun(
        "larger-number",
        "RULER (trained judge, read from probabilities; check hidden)",
        {"reward": reward},
        {"reward": "ruler"},
        trained_judge="ruler",
    ),
    "2048": LearningRun("2048", "game score", {"reward": reward}, {"test_games": 100}),
    "email-match": LearningRun("email", "match (verifiable)", {"correct": metric("correct")}, {"reward": "match"}),
    "email-ruler": LearningRun(
        "email", "RULER (base-model judge)", {"correct": metric("correct")}, {"reward": "ruler"}
    ),
    "rubric-checked": LearningRun(
        "rubric",
        "code checks (the ceiling for the judged rows)",
        {"judge pass rate, reworded rubrics": reward, "code-checked pass rate": metric("independent_reward")},
        {"reward": "checked"},
    ),
    "rubric-rubric": LearningRun(
        "rubric",
        "rubric judge (base model)",
        {"judge pass rate, reworded rubrics": reward, "code-checked pass rate": metric("independent_reward")},
        {"reward": "rubric"},
    ),
    "rubric-ruler": LearningRun(
        "rubric",
        "RULER with the rubrics (base model)",
        {"judge pass rate, reworded rubrics": reward, "code-checked pass rate": metric("independent_reward")},
        {"reward": "ruler"},
    ),
    "rubric-rubric-trained-judge": LearningRun(
        "rubric",
        "rubric judge (trained on its verdicts, read from probabilities)",
        {"judge pass rate, reworded rubrics": reward, "code-checked pass rate": metric("independent_reward")},
        {"reward": "rubric"},
        trained_judge="rubric",
    ),
    "rubric-ruler-trained-judge": LearningRun(
        "rubric",
        "RULER with the rubrics (trained judge, read from probabilities)",
        {"judge pass rate, reworded rubrics": reward, "code-checked pass rate": metric("independent_reward")},
        {"reward": "ruler"},
        trained_judge="ruler",
    ),
    "rubric-ruler-policy-judge": LearningRun(  # its judge trained on a policy's own answers (judge_data --from-run)
        "rubric",
        "RULER with the rubrics (judge trained on a policy's answers, read from probabilities)",
        {"judge pass rate, reworded rubrics": reward, "code-checked pass rate": metric("independent_reward")},
        {"reward": "ruler"},
        trained_judge="ruler",
    ),
    "email-ruler-trained-judge": LearningRun(  # half the held-out questions: a float32 CPU's hour has three evaluations
        "email",
        "RULER (trained judge, read from probabilities)",
        {"correct": metric("correct")},
        {"reward": "ruler", "test_questions": 54},
        trained_judge="ruler",
    ),
    "tool-use": LearningRun(
        "tools",
        "shaped (held out: strict)",
        {
            "strict success": metric("success"),
            "a tool called": metric("tool_called"),
            "valid calls / attempted (rollouts with a call)": metric("valid_call_rate"),
            "calls per rollout": metric("attempted_calls"),
        },
        {"reward": "shaped"},
    ),
    "rubric-ruler-generic": LearningRun(
        "rubric",
        "RULER, default rubric (base model)",
        {"judge pass rate, reworded rubrics": reward, "code-checked pass rate": metric("independent_reward")},
        {"reward": "ruler-generic"},
    ),
}


def mean_and_se(values: list[float]) -> tuple[float, float]:
    if not values:
        return math.nan, math.nan
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else math.nan
    return statistics.fmean(values), se


def paired_differences(before: list[Trajectory], after: list[Trajectory], score: Score) -> list[float]:
    """after - before per held-out item, items matched by their metadata (mean over an item's repeats);
    empty when the trajectories carry no identity."""

    def by_item(trajectories: list[Trajectory]) -> dict[str, float]:
        values: dict[str, list[float]] = {}
        for t in trajectories:
            value = score(t)
            if t.metadata and value is not None:
                values.setdefault(json.dumps(t.metadata, sort_keys=True, default=str), []).append(value)
        return {item: statistics.fmean(v) for item, v in values.items()}

    first, last = by_item(before), by_item(after)
    return [last[item] - first[item] for item in first.keys() & last.keys()]


def compare(before: list[Trajectory], after: list[Trajectory], score: Score) -> dict[str, float]:
    """Means before and after, their unpaired difference and, over items scored both times, the paired one."""
    values_before = [v for v in map(score, before) if v is not None]
    values_after = [v for v in map(score, after) if v is not None]
    (mean_before, se_before), (mean_after, se_after) = mean_and_se(values_before), mean_and_se(values_after)
    differences = paired_differences(before, after, score)
    paired_mean, paired_se = mean_and_se(differences)
    return {
        "n_before": len(values_before),
        "n_after": len(values_after),
        "before": mean_before,
        "after": mean_after,
        "difference": mean_after - mean_before,
        "difference_se": math.sqrt(se_before**2 + se_after**2),
        "paired_n": len(differences),
        "paired_difference": paired_mean,
        "paired_se": paired_se,
    }


def warm_start_step(run_dir: Path, start_step: int, end_step: int) -> int | None:
    """The step a warm start (SFT) ended at, where the run evaluated it: a held-out set between first and last."""
    steps = sorted({parse_record_stem(p.stem)[1] for p in RunFolder(run_dir).trajectory_files("val")})
    between = [step for step in steps if start_step < step < end_step]
    return between[0] if between else None


def held_out(run_dir: Path, step: int) -> list[Trajectory]:
    return [t for g in load_trajectories(RunFolder(run_dir).trajectories("val", step)) for t in g.trajectories]


async def measure(name: str, spec: LearningRun, root: Path, trained_judges: dict[str, str | None]) -> dict[str, Any]:
    """Train `spec` on a fresh run under `root`; its held-out scores at the first and last step."""
    commands = load_environment(spec.env)
    options = dict(spec.options)
    if spec.trained_judge:
        trained_judge = trained_judges[spec.trained_judge]
        if trained_judge is None:
            option = "--trained-judge" if spec.trained_judge == "ruler" else "--trained-rubric-judge"
            kind = "" if spec.trained_judge == "ruler" else " --kind rubric"
            raise SystemExit(
                f"{name} is judged by a trained judge: give {option} RUN_FOLDER (agentrl judge train{kind})"
            )
        options["judge"] = f"run:{Path(trained_judge).resolve()}"
    summary = await commands.run("cpu", None, None, name=name, base_path=str(root), **options)
    run_dir = Path(summary.run_dir)
    before, after = held_out(run_dir, summary.start_step), held_out(run_dir, summary.end_step)
    scores = {label: compare(before, after, score) for label, score in spec.scores.items()}
    warm_step = warm_start_step(run_dir, summary.start_step, summary.end_step)
    if warm_step is not None:  # a warm start (SFT) before RL: RL's own share, from its held-out score on
        warm = held_out(run_dir, warm_step)
        for label, score in spec.scores.items():
            scores[f"{label}, RL only (from the warm start)"] = compare(warm, after, score)
    return {
        "env": spec.env,
        "training_reward": spec.training_reward,
        "scores": scores,
        **({"signal": rubric_signal.signal(run_dir)} if spec.env == "rubric" else {}),
        "steps": summary.end_step - summary.start_step,
        **trained_context(run_dir),
        "wall_s": summary.seconds,
        "run_dir": str(run_dir),
        **({"judge": options["judge"]} if spec.trained_judge else {}),
        "machine": machine(),
        "date": datetime.date.today().isoformat(),
    }


def trained_context(run_dir: Path) -> dict[str, float | None]:
    """Over the run's GRPO steps: the trained turns scored in their engine prompt, of all trained turns, and the
    mean sampler/trainer gap per trained token (steps recorded before either metric existed count nothing)."""
    steps = [m for m in read_metrics(run_dir) if m.get("split") == "train" and "mismatch_abs_mean" in m]
    counted = [m for m in steps if "sampled_turns" in m]
    return {
        "sampled_turns": sum(m["sampled_turns"] for m in counted),
        "context_exact_turns": sum(m.get("context_exact_turns", 0) for m in counted),
        "mismatch_abs_mean": statistics.mean(m["mismatch_abs_mean"] for m in steps) if steps else None,
    }


def machine() -> str:
    """The CPU, and whether it trains in bf16 or float32 (two 'AMD EPYC's differ by 3x on that)."""
    return f"{cpu_name()} ({'bf16' if cpu_has_native_bf16() else 'float32: no native bf16'})"


def table(results: dict[str, Any]) -> str:
    lines = [
        "| run | trained on | held-out score | n | base | trained | difference ± SE | steps | wall time | machine |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    machines = sorted({r["machine"] for r in results.values()})
    for name in [n for n in RUNS if n in results]:
        r = results[name]
        for label, s in r["scores"].items():
            if s.get("paired_n", 0) > 1:  # the same items before and after
                mean, se, note = s["paired_difference"], s["paired_se"], f" (paired, {s['paired_n']})"
            else:
                mean, se, note = s["difference"], s["difference_se"], ""
            difference = f"{mean:+.3f} ± {se:.3f}{note}"
            if abs(mean) > 2 * se:
                difference = f"**{difference}**"
            lines.append(
                f"| {name} | {r['training_reward']} | {label} | {s['n_before']} / {s['n_after']} | {s['before']:.3f} | "
                f"{s['after']:.3f} | {difference} | {r['steps']} | {r['wall_s'] / 60:.1f} min | "
                f"{machines.index(r['machine']) + 1} |"
            )
    legend = "; ".join(f"{i + 1}: {m}" for i, m in enumerate(machines))
    return (
        "Held-out score before (base model) and after training each CPU preset. n: held-out trajectories scored "
        "before / after (a failed rollout or judgement is left out, not scored). Difference: paired over the items "
        "scored both times where the run's items are identifiable, else unpaired. Bold: the difference is over twice "
        f"its standard error. Machines: {legend}.\n\n" + "\n".join(lines) + "\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", choices=sorted(RUNS), help="runs to (re)do; default: all")
    parser.add_argument("--table-only", action="store_true", help="rewrite the docs table from the saved results")
    parser.add_argument(
        "--trained-judge",
        default=None,
        help="a RULER judge's run folder (agentrl judge train) for *-ruler-trained-judge",
    )
    parser.add_argument(
        "--trained-rubric-judge",
        default=None,
        help="a rubric judge's run folder (agentrl judge train --kind rubric) for rubric-rubric-trained-judge",
    )
    args = parser.parse_args()
    results: dict[str, Any] = json.loads(LEARNING_RESULTS.read_text()) if LEARNING_RESULTS.exists() else {}
    if not args.table_only:
        root = cache_dir() / "learning-runs" / datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        judges = {"ruler": args.trained_judge, "rubric": args.trained_rubric_judge}
        for name in args.only or [n for n, run in RUNS.items() if not run.trained_judge or judges[run.trained_judge]]:
            print(f"\n=== {name} (runs under {root}) ===")
            results[name] = asyncio.run(measure(name, RUNS[name], root, judges))
            write_json_atomic(LEARNING_RESULTS, results)  # each finished run is kept, whatever follows
    text = table(results)
    print(text)
    replace_section(START, END, f"{START}\n{text}{END}")
    from benchmarks import judge_training  # its README headline shows the judged runs beside the checked ones

    judge_training.write_tables(json.loads(judge_training.JUDGE_RESULTS.read_text()))


if __name__ == "__main__":
    main()
