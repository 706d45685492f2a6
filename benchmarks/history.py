"""History as plots, read from the results files and their versions in git: agentrl's step against TRL's (every
committed version of compare_trl.json) and the adapter's sampling speed against the base model's (every labelled
row of sampling.json), one line per machine kind.

    .venv/bin/python -m benchmarks.history     # writes benchmarks/results/history_*.png
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from benchmarks.readme import ROOT

RESULTS = ROOT / "benchmarks" / "results"
TRL_PLOT = RESULTS / "history_trl_ratio.png"
ADAPTER_PLOT = RESULTS / "history_adapter_ratio.png"


def _kind(machine: str) -> str:
    """A machine label's kind: bf16 or float32, or "kind not recorded" for rows from before kinds were."""
    return next((kind for kind in ("bf16", "float32") if machine.startswith(kind)), "kind not recorded")


def _entries(version: dict[str, Any]) -> list[dict[str, Any]]:
    """compare_trl.json's entries in one committed version: one per machine now, a single entry at first."""
    if "speedup" in version or "speedup_median" in version:
        return [version]
    return [entry for entry in version.values() if isinstance(entry, dict) and "date" in entry]


def trl_ratios() -> list[tuple[str, str, float]]:
    """(date, machine kind, agentrl's speed-up over TRL per step) of every committed compare_trl.json, oldest first."""
    path = "benchmarks/results/compare_trl.json"
    commits = subprocess.run(
        ["git", "log", "--format=%H", "--reverse", "--", path], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    versions = [
        json.loads(subprocess.run(["git", "show", f"{c}:{path}"], cwd=ROOT, capture_output=True, text=True).stdout)
        for c in commits
    ]
    if (RESULTS / "compare_trl.json").exists():
        versions.append(json.loads((RESULTS / "compare_trl.json").read_text()))
    seen: dict[tuple[str, str], float] = {}
    for version in versions:
        for entry in _entries(version):
            ratio = entry.get("speedup_median", entry.get("speedup"))
            if ratio is not None:
                label = f"{entry['precision']}: {entry['machine']}" if "precision" in entry else entry["machine"]
                seen[(entry["date"], label)] = float(ratio)
    return sorted((date, _kind(label), ratio) for (date, label), ratio in seen.items())


def adapter_ratios() -> list[tuple[str, str, float]]:
    """(date, machine kind, adapter tokens/s over the base model's at concurrency 32) of every sampling.json row."""
    rows = json.loads((RESULTS / "sampling.json").read_text()).values()
    return sorted(
        (row["date"], _kind(row["machine"]), float(row["adapter_vs_base_c32"]))
        for row in rows
        if "adapter_vs_base_c32" in row and "date" in row
    )


def plot(points: list[tuple[str, str, float]], path: Path, ylabel: str, target: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(8, 3.5))
    dates = sorted({date for date, _, _ in points})
    for kind in sorted({kind for _, kind, _ in points}):
        mine = [(dates.index(date), value) for date, k, value in points if k == kind]
        axis.plot([x for x, _ in mine], [y for _, y in mine], "o", label=kind)
    axis.axhline(target, color="grey", linewidth=0.8, linestyle="--")
    axis.set_xticks(range(len(dates)), dates, rotation=30, ha="right", fontsize=8)
    axis.set_ylabel(ylabel)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main() -> None:
    plot(trl_ratios(), TRL_PLOT, "agentrl's step vs TRL's (x faster)", target=3.0)
    plot(adapter_ratios(), ADAPTER_PLOT, "adapter / base tokens/s (c32)", target=0.8)
    print(f"wrote {TRL_PLOT} and {ADAPTER_PLOT}")


if __name__ == "__main__":
    main()
