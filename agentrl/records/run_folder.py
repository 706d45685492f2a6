"""A run's folder, {base_path}/{project}/{name}, and where each thing lives in it: the one place the layout is spelled.

- `checkpoints/{step:04d}/`: the adapter (and optimizer) of each step (`CheckpointStore`);
- `metrics.jsonl`: one line per step and split; `scenarios.jsonl`: which scenarios each step consumed;
- `trajectories/{split}-{step:04d}.jsonl`: every trajectory of a step; `transcripts/` the same as HTML. A file
  is never replaced: a second record at the same step and split (a skipped step after a trained one, another
  held-out evaluation) takes the next copy, `{split}-{step:04d}.2.jsonl`, `.3`, ...;
- `reward.png`, `judge.png`: plots redrawn after every step; `judge_checks/`: `agentrl judge check` reports;
- `logs/`: the vLLM servers' logs.
"""

from __future__ import annotations

import contextlib
import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from agentrl.foundation.errors import ConfigurationError
from agentrl.records.checkpoints import CheckpointStore

_RECORD_NAME = re.compile(r"(?P<split>.+)-(?P<step>[0-9]{4,})(?:\.(?P<copy>[0-9]+))?")

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
        """The record of consumed scenarios (`agentrl.records.scenario_record`)."""
        return self.path / "scenarios.jsonl"

    @property
    def trajectories_dir(self) -> Path:
        return self.path / "trajectories"

    def trajectories(self, split: str, step: int, copy: int = 1) -> Path:
        """A step's trajectory file: the first record of `split` at `step`, or a later `copy`."""
        return self.trajectories_dir / f"{record_stem(split, step, copy)}.jsonl"

    def trajectory_names(self, split: str, step: int) -> Iterator[Path]:
        """Every name a record of `split` at `step` may take, first copy first (`files.write_text_new`)."""
        return (self.trajectories(split, step, copy) for copy in itertools.count(1))

    def trajectory_files(self, split: str = "*") -> list[Path]:
        """The recorded trajectory files of `split` ("*": all), by step and copy."""
        named = []
        for path in self.trajectories_dir.glob(f"{split}-*.jsonl"):
            with contextlib.suppress(ConfigurationError):  # a file of the user's own, not a record
                named.append((parse_record_stem(path.stem)[1:], path))
        return [path for _, path in sorted(named)]

    def transcript(self, split: str, step: int, copy: int = 1) -> Path:
        return self.transcripts_dir / f"{record_stem(split, step, copy)}.html"

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


def record_stem(split: str, step: int, copy: int = 1) -> str:
    """`{split}-{step:04d}`, and `.{copy}` after the first: the name of a step's trajectories and transcript."""
    return f"{split}-{step:04d}" + (f".{copy}" if copy > 1 else "")


def parse_record_stem(stem: str) -> tuple[str, int, int]:
    """(split, step, copy) from a record file's stem (`record_stem`); a ConfigurationError for another name."""
    match = _RECORD_NAME.fullmatch(stem)
    if match is None:
        raise ConfigurationError(f"{stem!r} is not a record's name (SPLIT-STEP or SPLIT-STEP.COPY)")
    return match["split"], int(match["step"]), int(match["copy"] or 1)
