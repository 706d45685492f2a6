"""The README's main job, timed: `agentrl train larger-number` from a fresh run folder, its held-out reward before and
after, and this machine's kind. Each run adds an entry to benchmarks/results/main_job.json; the README's headline
(the latest run per machine kind), the history table on the benchmarks page and the plot are rendered from it. A run
this script ran also gives the front page its figure: the run's own reward plot (docs/images/main-job-reward.png,
its sha256 recorded in the entry) and one held-out question before and after, from the run's trajectory files.

    .venv/bin/python -m benchmarks.main_job [--setup-s SECONDS] [--note TEXT]   # run the job, record it, render
    .venv/bin/python -m benchmarks.main_job --log JOB.LOG --job-s S [--setup-s S]  # record a job run elsewhere
    .venv/bin/python -m benchmarks.main_job --render                            # render from the file only

Run from a fresh clone to measure what a newcomer meets: `--setup-s` is then the time `scripts/setup.sh` took.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agentrl.foundation.files import write_json_atomic
from benchmarks.readme import ROOT, replace_section
from benchmarks.step_breakdown import cpu_name, precision_label

RESULTS = ROOT / "benchmarks" / "results" / "main_job.json"
PLOT = ROOT / "benchmarks" / "results" / "main_job.png"
FIGURE = ROOT / "docs" / "images" / "main-job-reward.png"
"""The front page's plot: the latest figure run's own reward.png (README.md and docs/index.md show it)."""
TRANSCRIPT = ("<!-- benchmark:main_job_transcript:start -->", "<!-- benchmark:main_job_transcript:end -->")
HEADLINE = ("<!-- benchmark:main_job:start -->", "<!-- benchmark:main_job:end -->")
HISTORY = ("<!-- benchmark:main_job_history:start -->", "<!-- benchmark:main_job_history:end -->")
HELD_OUT = re.compile(r"^held-out at step (\d+): reward_mean ([0-9.]+)", re.MULTILINE)


def held_out(log: str) -> tuple[float, float]:
    """The held-out reward before and after training, as the job printed them last."""
    found = HELD_OUT.findall(log)
    if len(found) < 2:
        raise SystemExit("the job's output has no 'held-out at step N: reward_mean X' lines before and after training")
    return float(found[-2][1]), float(found[-1][1])


def commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True)
    return out.stdout.strip() + ("+" if dirty.stdout.strip() else "")


def run_job() -> tuple[str, float, dict[str, Any]]:
    """The job in a fresh temporary run folder; its output, wall time and front-page figure (`figure_of`)."""
    with tempfile.TemporaryDirectory(prefix="agentrl-main-job-") as runs:
        started = time.perf_counter()
        done = subprocess.run(
            [str(ROOT / ".venv" / "bin" / "agentrl"), "train", "larger-number", "--base-path", runs],
            capture_output=True,
            text=True,
        )
        elapsed = time.perf_counter() - started
        sys.stdout.write(done.stdout[-2000:])
        if done.returncode != 0:
            raise SystemExit(f"the main job failed ({done.returncode}): {done.stderr[-2000:]}")
        (plot_file,) = Path(runs).rglob("reward.png")
        return done.stdout, elapsed, figure_of(plot_file.parent)


def figure_of(run_dir: Path) -> dict[str, Any]:
    """The run's reward plot copied to `FIGURE` (its sha256 kept), and a held-out question before and after
    training: the first whose reward rose, else the first, as the run's first and last val files recorded it."""
    from agentrl.records.run_folder import RunFolder, parse_record_stem
    from agentrl.records.tracking import load_trajectories

    staged = FIGURE.with_name(FIGURE.name + ".tmp")
    shutil.copyfile(run_dir / "reward.png", staged)
    os.replace(staged, FIGURE)  # atomically: the page never shows half a file
    first, *_, last = RunFolder(run_dir).trajectory_files("val")

    def answers(path: Path) -> dict[str, tuple[str, float]]:
        found = {}
        for group in load_trajectories(path):
            for t in group.trajectories:
                messages = t.messages()
                question = next(str(m["content"]) for m in messages if m["role"] == "user")
                found.setdefault(question, (str(messages[-1].get("content") or "").strip(), t.reward))
        return found

    before, after = answers(first), answers(last)
    shared = [q for q in before if q in after]
    question = next((q for q in shared if after[q][1] > before[q][1]), shared[0])

    def side(path: Path, found: dict[str, tuple[str, float]]) -> dict[str, Any]:
        answer, reward = found[question]
        return {"step": parse_record_stem(path.stem)[1], "file": path.name, "answer": answer, "reward": reward}

    return {
        "reward_plot_sha256": hashlib.sha256(FIGURE.read_bytes()).hexdigest(),
        "question": question,
        "before": side(first, before),
        "after": side(last, after),
    }


def figure_run(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The newest run that recorded a front-page figure: the plot and transcript on the front page are its."""
    return next((r for r in reversed(runs) if "figure" in r), None)


def transcript(run: dict[str, Any]) -> str:
    """README's before/after block for `run`'s figure, with where it came from."""
    figure = run["figure"]
    before, after = figure["before"], figure["after"]
    width = max(len(f"assistant, step {s['step']}:") for s in (before, after)) + 2
    lines = [f"{'user:':<{width}}{figure['question']}"]
    for side in (before, after):
        lines.append(
            f"{'assistant, step ' + str(side['step']) + ':':<{width}}{side['answer']}    reward {side['reward']:.1f}"
        )
    return "\n".join(
        [
            TRANSCRIPT[0],
            f"The plot is that run's own `reward.png` ({run['kind']} {run['cpu']}, {run.get('commit') or 'n/a'}, "
            f"{run['date']}: held-out {run['heldout_before']:.3f} -> {run['heldout_after']:.3f}). One held-out "
            f"question from its trajectory files (`trajectories/{before['file']}` before training, "
            f"`{after['file']}` after; the HTML transcripts show the same):",
            "",
            "```text",
            *lines,
            "```",
            TRANSCRIPT[1],
        ]
    )


def minutes(seconds: float | None) -> str:
    return "" if seconds is None else f"{int(seconds) // 60} min {int(seconds) % 60} s"


def latest_per_kind(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The newest fresh-clone run of each machine kind (bf16 first)."""
    latest: dict[str, dict[str, Any]] = {}
    for run in runs:
        if run.get("fresh_clone", True):
            latest[run["kind"]] = run
    return [latest[kind] for kind in sorted(latest)]


COLUMNS = ("machine", "commit (date)", "set-up", "main job", "held-out reward")


def _cells(run: dict[str, Any]) -> list[str]:
    """A run's cells under `COLUMNS`."""
    return [
        f"{run['kind']} {run['cpu']}",
        f"{run.get('commit') or 'n/a'} ({run['date']})",
        minutes(run.get("setup_s")),
        minutes(run["job_s"]),
        f"{run['heldout_before']:.3f} -> {run['heldout_after']:.3f}",
    ]


def _table(markers: tuple[str, str], columns: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join([markers[0], *lines, markers[1]])


def headline(runs: list[dict[str, Any]]) -> str:
    """README's table: the newest fresh-clone run of each machine kind."""
    return _table(HEADLINE, list(COLUMNS), [_cells(r) for r in latest_per_kind(runs)])


def history(runs: list[dict[str, Any]]) -> str:
    """The benchmarks page's table: every run, oldest first, whether from a fresh clone, and its note."""
    rows = [[*_cells(r), "yes" if r.get("fresh_clone", True) else "no", r.get("note", "")] for r in runs]
    return _table(HISTORY, [*COLUMNS, "fresh clone", "note"], rows)


def plot(runs: list[dict[str, Any]]) -> None:
    """Main-job time and held-out reward after training, run by run, one line per machine kind."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (time_axis, reward_axis) = plt.subplots(2, 1, figsize=(9, 5.5), sharex=True)
    for kind in sorted({r["kind"] for r in runs}):
        indexed = [(i, r) for i, r in enumerate(runs) if r["kind"] == kind]
        xs = [i for i, _ in indexed]
        time_axis.plot(xs, [r["job_s"] / 60 for _, r in indexed], "o-", label=kind)
        reward_axis.plot(xs, [r["heldout_after"] for _, r in indexed], "o-", label=kind)
    time_axis.set_ylabel("main job (min)")
    reward_axis.set_ylabel("held-out reward after")
    reward_axis.set_xlabel("run, oldest first (benchmarks/results/main_job.json)")
    reward_axis.axhline(0.9, color="grey", linewidth=0.8, linestyle="--")
    time_axis.legend()
    figure.tight_layout()
    figure.savefig(PLOT, dpi=100)
    plt.close(figure)


def render(runs: list[dict[str, Any]]) -> None:
    replace_section(*HEADLINE, headline(runs))
    if (run := figure_run(runs)) is not None:
        replace_section(*TRANSCRIPT, transcript(run))
    replace_section(*HISTORY, history(runs))
    plot(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--render", action="store_true", help="only render the tables and plot from the results")
    parser.add_argument("--log", type=Path, help="record a job run elsewhere from its output (with --job-s)")
    parser.add_argument("--job-s", type=float, help="the job's wall time, with --log")
    parser.add_argument("--setup-s", type=float, help="how long scripts/setup.sh took, where measured")
    parser.add_argument("--note", default="", help="what sets this run apart")
    parser.add_argument("--working-copy", action="store_true", help="measured in a working copy, not a fresh clone")
    args = parser.parse_args()
    results = json.loads(RESULTS.read_text())
    if not args.render:
        if args.log is not None:
            if args.job_s is None:
                parser.error("--log needs --job-s")
            log, job_s, figure = args.log.read_text(), args.job_s, None
        else:
            log, job_s, figure = run_job()
        before, after = held_out(log)
        run = {
            "kind": precision_label(),
            "cpu": cpu_name(),
            "commit": commit(),
            "date": datetime.date.today().isoformat(),
            "setup_s": None if args.setup_s is None else round(args.setup_s),
            "job_s": round(job_s),
            "heldout_before": before,
            "heldout_after": after,
            "fresh_clone": not args.working_copy,
        }
        if args.note:
            run["note"] = args.note
        if figure is not None:
            run["figure"] = figure
        results["runs"].append(run)
        write_json_atomic(RESULTS, results)
    render(results["runs"])


if __name__ == "__main__":
    main()
