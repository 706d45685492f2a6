"""Judge checks from a run folder and back into it: recorded groups in; a table, JSON and a page out."""

from __future__ import annotations

import html
import math
import statistics
import time
from pathlib import Path

from agentrl.data.trajectory_group import TrajectoryGroup
from agentrl.foundation.errors import ConfigurationError
from agentrl.foundation.files import write_text_atomic
from agentrl.judges.check import JudgeCheckReport, reference_reward
from agentrl.records.run_folder import RunFolder
from agentrl.records.tracking import load_trajectories


def recorded_groups(run_dir: Path, *, split: str = "train", max_groups: int = 8) -> tuple[list[TrajectoryGroup], int]:
    """Up to `max_groups` recorded groups of `split` (those whose reference reward varies first), and
    the median number of groups per recorded step."""
    files = RunFolder(Path(run_dir)).trajectory_files(split)
    if not files:
        raise ConfigurationError(
            f"{run_dir} has no recorded {split} trajectories (trajectories/{split}-*.jsonl); train a step first"
        )
    per_file = [load_trajectories(f) for f in files]
    groups = [g for groups in per_file for g in groups if len(g.trajectories) >= 2]
    varied = sorted(groups, key=lambda g: len({reference_reward(t) for t in g.trajectories}) == 1)  # stable
    return varied[:max_groups], int(statistics.median(len(g) for g in per_file))


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


COLUMNS = (
    "judge",
    "groups (informative)",
    "pairwise acc [95%]",
    "tau [95%]",
    "shuffle: score change / rank flips",
    "position 1 bias",
    "repeat: score change / identical",
    "s per group",
    "tokens per group (in/out)",
    "$ per step",
    "failed calls",
)


def rows(reports: list[JudgeCheckReport]) -> list[list[str]]:
    out = []
    for r in reports:
        a, t = r.pairwise_accuracy, r.kendall_tau
        out.append(
            [
                r.judge,
                f"{r.groups} ({r.informative_groups})",
                f"{_fmt(a.value)} [{_fmt(a.low)}, {_fmt(a.high)}] of {a.n} pairs",
                f"{_fmt(t.value)} [{_fmt(t.low)}, {_fmt(t.high)}]",
                f"{_fmt(r.order_score_change)} / {_fmt(r.order_rank_flip_rate)}",
                f"{r.position_bias:+.2f}" if not math.isnan(r.position_bias) else "-",
                f"{_fmt(r.repeat_score_change)} / {_fmt(r.repeat_identical_fraction)}",
                _fmt(r.latency_s_mean, 1),
                f"{r.prompt_tokens_per_group:.0f} / {r.completion_tokens_per_group:.0f}",
                _fmt(r.usd_per_step, 4) if r.usd_per_step is not None else "unpriced",
                f"{r.failed_calls} of {r.calls}",
            ]
        )
    return out


def table(reports: list[JudgeCheckReport]) -> str:
    """The terminal table: one judge per block, one measure per line (long judge names fit)."""
    lines = []
    for row in rows(reports):
        lines += [f"{name:<36} {value}" for name, value in zip(COLUMNS, row)] + [""]
    return "\n".join(lines)


def page(reports: list[JudgeCheckReport], title: str) -> str:
    """A self-contained HTML page: the table, scores by prompt position, and what each measure means."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in row) + "</tr>" for row in rows(reports))
    positions = "".join(
        f"<tr><td>{html.escape(r.judge)}</td>" + "".join(f"<td>{_fmt(m)}</td>" for m in r.position_mean_score) + "</tr>"
        for r in reports
    )
    notes = (
        "Reference: the run's verifiable reward (independent_reward where a judge replaced it). "
        "Pairwise accuracy: pairs the reference orders strictly that the judge orders the same way (tie = half); "
        "a judge that guesses scores 0.5, tau 0. Intervals: 95% bootstrap over groups. Shuffle: the same group "
        "with its trajectories in other orders. Position 1 bias: mean score at the first position minus the mean "
        "over all positions. Repeat: the same call made again."
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        "<style>body{font-family:system-ui,sans-serif;margin:2em}td,th{border:1px solid #ccc;padding:4px 8px}"
        "table{border-collapse:collapse;margin:1em 0}</style></head><body>"
        f"<h1>{html.escape(title)}</h1><table><tr>{head}</tr>{body}</table>"
        f"<h2>Mean score by position in the prompt</h2><table><tr><th>judge</th><th colspan='99'>position 1, 2, ...</th></tr>"
        f"{positions}</table><p>{html.escape(notes)}</p></body></html>"
    )


def write_check(run_dir: Path, reports: list[JudgeCheckReport]) -> tuple[Path, Path]:
    """judge_checks/{time}.json and .html in the run folder (written atomically)."""
    stem = RunFolder(Path(run_dir)).judge_checks / time.strftime("%Y%m%d-%H%M%S")
    json_path, html_path = stem.with_suffix(".json"), stem.with_suffix(".html")
    listed = ",\n".join(r.model_dump_json(indent=2) for r in reports)  # NaN (nothing to measure) as null
    write_text_atomic(json_path, f"[\n{listed}\n]\n")
    write_text_atomic(html_path, page(reports, f"Judge check: {Path(run_dir).parent.name}/{Path(run_dir).name}"))
    return json_path, html_path
