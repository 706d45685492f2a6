"""A run's folder, {base_path}/{project}/{name}, and where each thing lives in it: the one place the layout is spelled.

- `checkpoints/{step:04d}/`: the adapter (and optimizer) of each step (`CheckpointStore`);
- `metrics.jsonl`: one line per step and split; `scenarios.jsonl`: which scenarios each step consumed;
- `trajectories/{split}-{step:04d}.jsonl`: every trajectory of a step; `transcripts/` the same as HTML;
- `reward.png`, `judge.png`: plots redrawn after every step; `judge_checks/`: `agentrl judge check` reports;
- `logs/`: the vLLM servers' logs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from agentrl.backend.checkpoints import CheckpointStore

DEFAULT_BASE_PATH = ".agentrl"
"""Where runs live unless told otherwise (`TrainableModel(base_path=...)`, `--base-path`), relative to the cwd."""


@dataclass(frozen=True)
class RunFolder:
    """The files of one run."""

    path: Path

    @classmethod
    def of(cls, project: str, name: str, base_path: str | Path = DEFAULT_BASE_PATH) -> RunFolder:
        return cls(Path(base_path) / project / name)

    @property
    def checkpoints(self) -> CheckpointStore:
        return CheckpointStore(self.path)

    @property
    def metrics(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def scenarios(self) -> Path:
        """The record of consumed scenarios (`agentrl.scenario_record`)."""
        return self.path / "scenarios.jsonl"

    @property
    def trajectories_dir(self) -> Path:
        return self.path / "trajectories"

    def trajectories(self, split: str, step: int) -> Path:
        return self.trajectories_dir / f"{split}-{step:04d}.jsonl"

    def trajectory_files(self, split: str = "*") -> list[Path]:
        """The recorded trajectory files of `split` ("*": all), by step."""
        return sorted(self.trajectories_dir.glob(f"{split}-*.jsonl"))

    def transcript(self, split: str, step: int) -> Path:
        return self.transcripts_dir / f"{split}-{step:04d}.html"

    @property
    def transcripts_dir(self) -> Path:
        return self.path / "transcripts"

    @property
    def reward_plot(self) -> Path:
        return self.path / "reward.png"

    @property
    def judge_plot(self) -> Path:
        return self.path / "judge.png"

    @property
    def judge_checks(self) -> Path:
        return self.path / "judge_checks"

    @property
    def logs(self) -> Path:
        return self.path / "logs"
