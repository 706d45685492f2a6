"""Finding and reading run folders ({base_path}/{project}/{name}) without writing to them.

`agentrl runs`, `show` and `serve` only read: the checkpoint steps and metrics.jsonl of each run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.foundation.errors import ConfigurationError
from agentrl.records.checkpoints import CheckpointStore
from agentrl.records.tracking import read_metrics

COMPARED = ("loss", "kl_sampler_trainer", "grad_norm", "update_norm")
"""What a what-if run is compared with its original on, step by step (`agentrl whatif`, `agentrl show --against`)."""


@dataclass(frozen=True)
class RunInfo:
    """A run folder's complete checkpoint steps and recorded metrics."""

    path: Path
    steps: list[int]
    metrics: list[dict[str, Any]]

    @property
    def label(self) -> str:
        """PROJECT/NAME."""
        return f"{self.path.parent.name}/{self.path.name}"

    def trained_steps(self) -> dict[int, dict[str, Any]]:
        """The metrics of each train step that updated the adapter, by step."""
        return {m["step"]: m for m in self.metrics if m.get("split") == "train" and not m.get("skipped")}

    def best(self, split: str) -> float | None:
        """The highest mean reward recorded for `split` (None when none was)."""
        values = [
            m["reward_mean"]
            for m in self.metrics
            if m.get("split") == split and isinstance(m.get("reward_mean"), float)
        ]
        return max(values) if values else None


def run_info(path: Path) -> RunInfo:
    return RunInfo(path, CheckpointStore(path).steps(), read_metrics(path))


def find_runs(base_path: str | Path) -> list[RunInfo]:
    """Every run under `base_path` that has a checkpoint or a metrics file."""
    root = Path(base_path)
    folders = sorted(
        {p.parent.parent for p in root.glob("*/*/checkpoints/*")} | {p.parent for p in root.glob("*/*/metrics.jsonl")}
    )
    return [run_info(p) for p in folders]


def resolve_run(run: str, base_path: str | Path) -> RunInfo:
    """A run given as PROJECT/NAME under `base_path`, or as a folder; `ConfigurationError` listing the runs if none."""
    path = Path(run) if Path(run).is_dir() else Path(base_path) / run
    if not path.is_dir():
        known = ", ".join(r.label for r in find_runs(base_path)) or "none yet"
        raise ConfigurationError(f"no run {run!r} under {base_path} (give PROJECT/NAME or a folder); runs: {known}")
    return run_info(path)
