"""Checkpoints: one folder per step, `checkpoints/{step:04d}/`, written atomically.

A checkpoint is written into a hidden staging folder and renamed into place, and its
`agentrl-checkpoint.json` (step, metrics) is written last, before the rename. So a folder named
by its step is always complete; a crash leaves only a staging folder, which is ignored and swept.
Step 0 is the untrained adapter. Resuming means the highest complete step.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl.errors import CheckpointError

INFO_FILE = "agentrl-checkpoint.json"
_STAGING_PREFIX = ".staging-"


def write_text_atomic(path: Path, text: str) -> None:
    """Write through a temporary file (flushed to disk) and a rename, so a crash never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_json_atomic(path: Path, data: Any) -> None:
    """`write_text_atomic` for JSON."""
    write_text_atomic(path, json.dumps(data, indent=2))


class CheckpointStore:
    """The checkpoint folders of one run."""

    def __init__(self, run_dir: Path) -> None:
        self.root = Path(run_dir) / "checkpoints"

    def path(self, step: int) -> Path:
        return self.root / f"{step:04d}"

    def steps(self) -> list[int]:
        """Steps with a complete checkpoint, ascending."""
        if not self.root.exists():
            return []
        return sorted(
            int(p.name) for p in self.root.iterdir() if p.is_dir() and p.name.isdigit() and (p / INFO_FILE).exists()
        )

    def latest_step(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

    def info(self, step: int) -> dict[str, Any]:
        """What was recorded with a checkpoint (step, metrics)."""
        try:
            return json.loads((self.path(step) / INFO_FILE).read_text())
        except FileNotFoundError as error:
            raise CheckpointError(f"no complete checkpoint for step {step} in {self.root}") from error

    def save(self, step: int, write: Callable[[Path], None], info: dict[str, Any]) -> Path:
        """Let `write` fill a staging folder, record `info`, then rename it into place."""
        final = self.path(step)
        if final.exists():
            raise CheckpointError(f"checkpoint {final} already exists; checkpoints are never overwritten")
        self.root.mkdir(parents=True, exist_ok=True)
        staging = self.root / f"{_STAGING_PREFIX}{step:04d}-{uuid.uuid4().hex[:8]}"
        staging.mkdir()
        try:
            write(staging)
            write_json_atomic(staging / INFO_FILE, {"step": step, **info})
            os.rename(staging, final)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return final

    def sweep_staging(self) -> None:
        """Remove folders left by a crash in the middle of a save."""
        if self.root.exists():
            for p in self.root.glob(f"{_STAGING_PREFIX}*"):
                shutil.rmtree(p, ignore_errors=True)

    def delete(self, *, keep_last: int = 1, best_by: str | None = None) -> list[int]:
        """Delete checkpoints except the last `keep_last` and, with `best_by`, the one with the highest
        value of that metric. The latest is always kept (it is the one being served)."""
        if keep_last < 1:
            raise ValueError("keep_last must be >= 1: the latest checkpoint is the one being served")
        steps = self.steps()
        keep = set(steps[-keep_last:])
        if best_by is not None:
            scored = {s: self.info(s).get("metrics", {}).get(best_by) for s in steps}
            scored = {s: v for s, v in scored.items() if isinstance(v, (int, float))}
            if not scored:
                raise ValueError(f"no checkpoint recorded the metric {best_by!r}; pick one of the step metrics")
            keep.add(max(scored, key=lambda s: scored[s]))
        deleted = [s for s in steps if s not in keep]
        for step in deleted:
            shutil.rmtree(self.path(step))
        return deleted
