"""Run tracking on local files: what a user looks at while training and after.

In the run folder (`RunFolder`):
- `metrics.jsonl`: one line per step and split (reward mean/std, trainer metrics, timings);
- `trajectories/{split}-{step:04d}.jsonl`: every trajectory of that step, reloadable with
  `load_trajectories`;
- `transcripts/{split}-{step:04d}.html`: the same trajectories as a page to read in a browser (no
  server): messages, tool calls and results, reward and metrics, grouped by scenario;
- `reward.png`: training and evaluation reward per step, redrawn after every step; where a judge gave
  the reward, the independent reward too, with steps flagged where the judge's rose while it fell.
Every file is written to a temporary name and renamed into place, so a crash never leaves half a file.
"""

from __future__ import annotations

import html
import json
import logging
import os
import time
import uuid
from pathlib import Path
from typing import Any

from openai.types.chat.chat_completion import Choice

from agentrl.data.tool_calls import assistant_content, tool_call_parse_failures, unparsed_tool_calls
from agentrl.data.trajectory import Trajectory, reward_stats
from agentrl.data.trajectory_group import TrajectoryGroup
from agentrl.foundation.files import append_line, read_lines, write_text_atomic, write_text_new
from agentrl.records.judge_warning import audit_warning, judge_figures
from agentrl.records.run_folder import RunFolder, parse_record_stem

logger = logging.getLogger(__name__)


def append_metrics(run_dir: Path, record: dict[str, Any]) -> None:
    """Append one line to metrics.jsonl (whole lines only; NaN written as null)."""
    append_line(RunFolder(Path(run_dir)).metrics, {"time": time.time(), **record})


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = RunFolder(Path(run_dir)).metrics
    return read_lines(path) if path.exists() else []


DEFAULT_BEST_BY = "val/reward_mean"
"""What `delete_checkpoints` keeps besides the latest by default: the best held-out reward (`model.log`), as ART."""


def best_step(run_dir: Path, metric: str, among: list[int]) -> int | None:
    """The step in `among` with the highest recorded `metric`, as "split/name" ("val/reward_mean"; a bare
    name means "train/name"), from metrics.jsonl; None when no step in `among` recorded it."""
    split, _, name = metric.rpartition("/")
    split = split or "train"
    values = {
        r["step"]: r[name]
        for r in read_metrics(run_dir)
        if r.get("split") == split and r.get("step") in among and isinstance(r.get(name), (int, float))
    }
    return max(values, key=lambda s: values[s]) if values else None


def trajectory_lines(groups: list[TrajectoryGroup]) -> list[str]:
    """One JSON line per trajectory, tagged with its group's index: how groups are kept on disk."""
    return [
        json.dumps({"group": g_index, **t.model_dump(mode="json")})
        for g_index, group in enumerate(groups)
        for t in group.trajectories
    ]


def groups_from_rows(rows: list[dict[str, Any]]) -> list[TrajectoryGroup]:
    """The groups `trajectory_lines` wrote, from their lines read as JSON."""
    groups: dict[int, list[Trajectory]] = {}
    for data in rows:
        groups.setdefault(data.pop("group"), []).append(Trajectory.model_validate(data))
    return [TrajectoryGroup(groups[k]) for k in sorted(groups)]


def write_trajectories(run_dir: Path, step: int, split: str, groups: list[TrajectoryGroup]) -> Path:
    """Save a step's trajectories (one JSON line each, tagged with its group) and return the path. An earlier
    record of the same split and step is never replaced: this one takes the next copy's name."""
    return write_text_new(
        RunFolder(Path(run_dir)).trajectory_names(split, step), "\n".join(trajectory_lines(groups)) + "\n"
    )


def load_trajectories(path: Path) -> list[TrajectoryGroup]:
    """The groups saved by `write_trajectories`."""
    return groups_from_rows(read_lines(path))


TRANSCRIPT_CLASS = "agentrl-transcript"
"""The element a transcript's content and every rule of its style are scoped to: shown inside another page (a
notebook's output, the docs site), it restyles nothing outside itself."""
_STYLE = """
.agentrl-transcript { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
.agentrl-transcript .group { border: 1px solid #ccc; border-radius: 6px; margin: 1.5em 0; padding: 0.5em 1em; }
.agentrl-transcript .trajectory { border-top: 1px dashed #bbb; padding: 0.5em 0; }
.agentrl-transcript .msg { margin: 0.3em 0; padding: 0.3em 0.6em; border-radius: 4px; white-space: pre-wrap; overflow-wrap: anywhere; }
.agentrl-transcript .system { background: #f3f3f3; } .agentrl-transcript .user { background: #e8f0fe; }
.agentrl-transcript .assistant { background: #e6f4ea; } .agentrl-transcript .tool { background: #fef7e0; }
.agentrl-transcript .call { font-family: monospace; color: #8a3b00; overflow-wrap: anywhere; }
.agentrl-transcript .failed { color: #b00020; } .agentrl-transcript .reward { font-weight: bold; }
.agentrl-transcript .metrics { color: #555; font-size: 0.9em; overflow-wrap: anywhere; }
"""


def _message_html(item: dict[str, Any] | Choice, *, tools_offered: bool) -> str:
    if isinstance(item, Choice):
        role, content = "assistant", item.message.content or ""
        calls = [(c.function.name, c.function.arguments) for c in item.message.tool_calls or [] if c.type == "function"]
    else:
        role, content = item["role"], item.get("content") or ""
        calls = [(c["function"]["name"], c["function"]["arguments"]) for c in item.get("tool_calls") or []]
    if not isinstance(content, str):
        content = json.dumps(content)
    parts = [f'<div class="msg {html.escape(role)}"><b>{html.escape(role)}</b>: {html.escape(content)}']
    parts += [f'<div class="call">→ {html.escape(name)}({html.escape(args)})</div>' for name, args in calls]
    if tools_offered and (failures := unparsed_tool_calls(assistant_content(item))):
        parts.append(f'<div class="call failed">✗ {failures} tool call(s) the server could not parse</div>')
    return "".join(parts) + "</div>"


def transcript_html(groups: list[TrajectoryGroup], title: str) -> str:
    """A self-contained page showing every trajectory, grouped by scenario; its style touches only its own
    content (`TRANSCRIPT_CLASS`), so a notebook can display it inline."""
    body = [f"<h1>{html.escape(title)}</h1>"]
    if failures := tool_call_parse_failures(groups):
        body.append(f'<p class="failed">tool_call_parse_failures: {failures} (marked ✗ below)</p>')
    for g_index, group in enumerate(groups):
        mean, std = reward_stats(group.rewards)
        body.append(f'<div class="group"><h2>group {g_index}: reward {mean:.3f} ± {std:.3f}</h2>')
        for t_index, t in enumerate(group.trajectories):
            metrics = ", ".join(f"{k}={v:.3g}" for k, v in t.metrics.items())
            body.append(
                f'<div class="trajectory"><span class="reward">trajectory {t_index}: reward {t.reward:.3f}</span>'
                f' <span class="metrics">{html.escape(metrics)}</span>'
            )
            for history_index, history in enumerate(t.histories()):
                if history_index:
                    body.append(f"<i>additional history {history_index}</i>")
                body += [_message_html(m, tools_offered=bool(history.tools)) for m in history.messages_and_choices]
            body += [f'<div class="metrics">log: {html.escape(line)}</div>' for line in t.logs]
            body.append("</div>")
        body += [
            f'<div class="metrics">exception: {html.escape(e.type)}: {html.escape(e.message)}</div>'
            for e in group.exceptions
        ]
        body.append("</div>")
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>{_STYLE}</style>"
        f"</head><body><div class='{TRANSCRIPT_CLASS}'>{''.join(body)}</div></body></html>"
    )


def write_transcript(run_dir: Path, step: int, split: str, groups: list[TrajectoryGroup], copy: int = 1) -> Path:
    """The page of a step's trajectories, named as their file (`copy`, from `write_trajectories`'s path)."""
    path = RunFolder(Path(run_dir)).transcript(split, step, copy)
    title = f"{Path(run_dir).name}: {split}, step {step}" + (f" (record {copy})" if copy > 1 else "")
    write_text_atomic(path, transcript_html(groups, title))
    return path


HACKING_MIN_CHANGE = 0.01
"""Changes smaller than this (either way) between steps are noise, not a trend, for the hacking flag."""


def reward_hacking_steps(records: list[dict[str, Any]]) -> list[int]:
    """Train steps where the judge's reward rose while the independent (verifiable) one fell, from the
    previous recorded step: the judge is being pleased by something other than the task."""
    points = sorted(
        (r["step"], r["reward_mean"], r["independent_reward"])
        for r in records
        if r.get("split") == "train"
        and not r.get("skipped")  # a skipped step trained nothing; its rewards are the same policy's again
        and isinstance(r.get("reward_mean"), (int, float))
        and isinstance(r.get("independent_reward"), (int, float))
    )
    return [
        step
        for (_, judge_before, independent_before), (step, judge, independent) in zip(points, points[1:])
        if judge - judge_before > HACKING_MIN_CHANGE and independent_before - independent > HACKING_MIN_CHANGE
    ]


AUDIT_SERIES = {
    "judge_flip_rate": "flip rate (order changed, lower is better)",
    "judge_pair_flip_rate": "pairs whose winner changed with the order shown (read from probabilities)",
    "judge_first_position_rate": "first shown wins",
    "judge_self_consistency": "self-consistency (tau)",
    "judge_independent_tau": "agreement with independent reward (tau)",
}


HACKING_EVALUATIONS = 3
"""Held-out evaluations over which a judge's reward rising and the independent one falling is warned about."""


def reward_hacking_trend(records: list[dict[str, Any]], split: str = "val") -> bool:
    """Whether over the last `HACKING_EVALUATIONS` evaluations of `split` the judge's reward rose at every
    one while the independent reward fell at every one: the policy learns to please the judge, not the task."""
    points = [
        (r["reward_mean"], r["independent_reward"])
        for r in sorted(records, key=lambda r: r.get("step", 0))
        if r.get("split") == split
        and isinstance(r.get("reward_mean"), (int, float))
        and isinstance(r.get("independent_reward"), (int, float))
    ][-HACKING_EVALUATIONS:]
    if len(points) < HACKING_EVALUATIONS:
        return False
    pairs = list(zip(points, points[1:]))
    return all(b[0] - a[0] > HACKING_MIN_CHANGE and a[1] - b[1] > HACKING_MIN_CHANGE for a, b in pairs)


def plot_judge_audit(run_dir: Path) -> Path | None:
    """Draw judge.png from metrics.jsonl: the judge audit's statistics per train step (and the chance level
    of the first-position rate); None, and nothing drawn, for a run with no audited step."""
    lines = [r for r in read_metrics(run_dir) if r.get("split") == "train"]
    records = [{"step": r.get("step", 0), **f} for r in lines if "judge_audited" in (f := judge_figures(r))]
    if not records:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4))
    for key, label in AUDIT_SERIES.items():
        points = sorted((r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float)))
        if points:
            axes.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
    chance = [r["judge_first_position_chance"] for r in records if "judge_first_position_chance" in r]
    if chance:
        axes.axhline(sum(chance) / len(chance), color="grey", linestyle=":", label="first shown wins by chance")
    axes.set_xlabel("step")
    axes.set_title(f"{Path(run_dir).name}: judge audit")
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")
    return _save_figure(figure, RunFolder(Path(run_dir)).judge_plot)


def plot_rewards(run_dir: Path) -> Path:
    """Draw reward.png from metrics.jsonl: mean reward per step for each split; where a judge gave the
    reward, the independent reward beside it, and a red mark on each step flagged by `reward_hacking_steps`."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    rewarded = [
        r for r in read_metrics(run_dir) if isinstance(r.get("reward_mean"), (int, float))
    ]  # None: no trajectories
    records = [r for r in rewarded if not r.get("skipped")]
    figure, axes = plt.subplots(figsize=(7, 4))
    if skipped := sorted((r["step"], r["reward_mean"]) for r in rewarded if r.get("skipped")):
        # A skipped step trained nothing, but its reward is a real measurement of the policy it sampled.
        axes.scatter([p[0] for p in skipped], [p[1] for p in skipped], facecolors="none", edgecolors="grey",
                     label="train, skipped (no signal, no update)")  # fmt: skip
    for split in sorted({r["split"] for r in records}):
        points = sorted((r["step"], r["reward_mean"]) for r in records if r["split"] == split)
        axes.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=split)
        independent = sorted(
            (r["step"], r["independent_reward"])
            for r in records
            if r["split"] == split and isinstance(r.get("independent_reward"), (int, float))
        )
        if independent:
            axes.plot(
                [p[0] for p in independent],
                [p[1] for p in independent],
                linestyle="--",
                marker=".",
                label=f"{split} independent_reward",
            )
    flagged = reward_hacking_steps(records)
    judged = {r["step"]: r["reward_mean"] for r in records if r["split"] == "train"}
    if flagged:
        axes.scatter(
            flagged,
            [judged[s] for s in flagged],
            s=140,
            facecolors="none",
            edgecolors="red",
            zorder=5,
            label="judge up, independent down",
        )
    axes.set_xlabel("step")
    axes.set_ylabel("mean reward")
    axes.set_title(Path(run_dir).name)
    axes.grid(alpha=0.3)
    if rewarded:
        axes.legend()
    else:
        axes.text(0.5, 0.5, "no step with a reward recorded yet", ha="center", va="center", transform=axes.transAxes)
    return _save_figure(figure, RunFolder(Path(run_dir)).reward_plot)


def _save_figure(figure: Any, path: Path) -> Path:
    """Write a matplotlib figure as a PNG atomically (a reader never sees half a plot), and close it."""
    import matplotlib.pyplot as plt

    tmp = path.with_name(f".{path.stem}.{uuid.uuid4().hex}.png")
    figure.savefig(tmp, dpi=100)
    plt.close(figure)
    os.replace(tmp, path)
    return path


def record_step(run_dir: Path, step: int, split: str, groups: list[TrajectoryGroup], metrics: dict[str, float]) -> None:
    """Everything a step leaves in the run folder: metrics line, trajectories, transcript, plot."""
    append_metrics(run_dir, {"step": step, "split": split, **metrics})
    if split == "train" and "independent_reward" in metrics and step in reward_hacking_steps(read_metrics(run_dir)):
        logger.warning(
            "step %d: the judge's reward rose while independent_reward fell (reward hacking?): read %s",
            step,
            RunFolder(Path(run_dir)).transcript(split, step),
        )
    if split != "train" and "independent_reward" in metrics and reward_hacking_trend(read_metrics(run_dir), split):
        logger.warning(
            "step %d: over the last %d %s evaluations the judge's reward rose and independent_reward fell at each "
            "(reward hacking?): read the transcripts in %s",
            step,
            HACKING_EVALUATIONS,
            split,
            RunFolder(Path(run_dir)).transcripts_dir,
        )
    if split == "train" and (judge_problem := audit_warning(metrics)) is not None:
        logger.warning("step %d: %s", step, judge_problem)
    if groups:
        saved = write_trajectories(run_dir, step, split, groups)
        write_transcript(run_dir, step, split, groups, parse_record_stem(saved.stem)[2])
    plot_rewards(run_dir)
    plot_judge_audit(run_dir)
