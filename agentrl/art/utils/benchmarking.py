"""ART's `art.utils.benchmarking`: compare models from their recorded trajectories, in charts.

`load_trajectories` reads every model's `trajectories/*.jsonl` under `{art_path}/{project}/models` into rows
(one per trajectory: model, split, step, reward, metrics); the charts take those rows."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from agentrl.foundation.errors import ConfigurationError
from agentrl.records.run_folder import RunFolder, parse_record_stem


def load_trajectories(
    project_name: str, models: list[str] | None = None, art_path: str = ".art"
) -> list[dict[str, Any]]:
    """One row per recorded trajectory: model, split, step, reward, and each metric by name."""
    root = Path(art_path) / project_name / "models"
    if not root.is_dir():
        raise ConfigurationError(f"{root} does not exist: no run of project {project_name!r} under {art_path}")
    rows = []
    for run in sorted(p for p in root.iterdir() if p.is_dir() and (models is None or p.name in models)):
        for path in RunFolder(run).trajectory_files():
            split, step, _ = parse_record_stem(path.stem)
            for line in path.read_text().splitlines():
                if line.strip():
                    data = json.loads(line)
                    rows.append({"model": run.name, "split": split, "step": step, "reward": data["reward"],
                                 **data.get("metrics", {})})  # fmt: skip
    return rows


def _mean_by(rows: list[dict[str, Any]], metric: str, *keys: str) -> dict[tuple[Any, ...], float]:
    sums: dict[tuple[Any, ...], list[float]] = defaultdict(list)
    for row in rows:
        if metric in row:
            sums[tuple(row[k] for k in keys)].append(float(row[metric]))
    return {k: sum(v) / len(v) for k, v in sums.items()}


def training_progress_chart(
    rows: list[dict[str, Any]], metric_name: str = "reward", models: list[str] | None = None, split: str = "val",
    title: str | None = None,
) -> Any:  # fmt: skip
    """A matplotlib Figure: `metric_name` averaged per step, one line per model."""
    import matplotlib.pyplot as plt

    means = _mean_by([r for r in rows if r["split"] == split], metric_name, "model", "step")
    figure, axes = plt.subplots(figsize=(7, 4))
    for model in models or sorted({m for m, _ in means}):
        points = sorted((step, v) for (m, step), v in means.items() if m == model)
        if points:
            axes.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=model)
    axes.set(xlabel="step", ylabel=metric_name, title=title or f"{split} {metric_name}")
    axes.legend()
    return figure


def percentage_comparison_bar_chart(
    rows: list[dict[str, Any]], metric_name: str = "reward", models: list[str] | None = None, split: str = "val",
    title: str | None = None,
) -> Any:  # fmt: skip
    """A matplotlib Figure: each model's `metric_name` at its last recorded step, as a percentage."""
    import matplotlib.pyplot as plt

    split_rows = [r for r in rows if r["split"] == split]
    last = {m: max(r["step"] for r in split_rows if r["model"] == m) for m in {r["model"] for r in split_rows}}
    means = _mean_by([r for r in split_rows if r["step"] == last[r["model"]]], metric_name, "model")
    names = [m for m in (models or sorted(last)) if (m,) in means]
    figure, axes = plt.subplots(figsize=(7, 4))
    axes.bar(names, [100 * means[(m,)] for m in names])
    axes.set(ylabel=f"{metric_name} (%)", title=title or f"{split} {metric_name} by model")
    return figure
