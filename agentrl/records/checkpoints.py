"""Checkpoints: one folder per step, `checkpoints/{step:04d}/`, written atomically.

A checkpoint is written into a hidden staging folder and renamed into place, and its
`agentrl-checkpoint.json` (step, metrics) is written last, before the rename. Every file and the
folder are fsynced before the rename, and the parent after it, so a folder named by its step is
complete even after a power loss; a crash leaves only a staging folder, which is ignored and swept.
Step 0 is the untrained adapter. Resuming means the highest checkpoint that validates; one that
does not is moved aside (`.corrupt-*`, never deleted) with a warning.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl.foundation.errors import CheckpointError, ConfigurationError
from agentrl.foundation.files import fsync_path, fsync_tree, write_json_atomic, write_text_atomic

INFO_FILE = "agentrl-checkpoint.json"
ADAPTER_FILE = "adapter_model.safetensors"
ADAPTER_CONFIG_FILE = "adapter_config.json"
OPTIMIZER_FILE = "optimizer.pt"
STEP_INPUT_FILE = "step_input.jsonl.gz"
STEP_RECORD_FILE = "step_record.jsonl.gz"
CHECKPOINT_FILES = frozenset(
    {INFO_FILE, ADAPTER_FILE, ADAPTER_CONFIG_FILE, OPTIMIZER_FILE, STEP_INPUT_FILE, STEP_RECORD_FILE}
)
"""Every file a checkpoint folder may hold: the info, peft's adapter and config, AdamW's state, the step's input
(`step_input`) and the step's record (its trajectories, to write the run's records again after a crash)."""
MAX_RECORD_BYTES = 1024**3
"""The most a checkpoint's step input or step record may inflate to when read (a step's groups are megabytes)."""
_STAGING_PREFIX = ".staging-"
_CORRUPT_PREFIX = ".corrupt-"


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

    def adapter_config(self, step: int) -> dict[str, Any]:
        """peft's adapter_config.json of a checkpoint: its base model (`base_model_name_or_path`), rank (`r`), ..."""
        path = self.path(step) / "adapter_config.json"
        try:
            return dict(json.loads(path.read_text()))
        except FileNotFoundError as error:
            raise CheckpointError(f"no adapter in the checkpoint for step {step}: {path} is missing") from error

    def info(self, step: int) -> dict[str, Any]:
        """What was recorded with a checkpoint (step, metrics); `CheckpointError` if it is missing or unreadable."""
        path = self.path(step) / INFO_FILE
        try:
            info = json.loads(path.read_text())
        except FileNotFoundError as error:
            raise CheckpointError(f"no complete checkpoint for step {step} in {self.root}") from error
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise CheckpointError(f"the checkpoint info {path} is not valid JSON (empty or torn): {error}") from error
        if not isinstance(info, dict) or info.get("step") != step:
            raise CheckpointError(f"the checkpoint info {path} does not record step {step}: {str(info)[:200]}")
        return info

    def move_aside(self, step: int, why: str) -> Path:
        """Rename a bad checkpoint out of the resume order (kept for inspection, never deleted)."""
        aside = self.root / f"{_CORRUPT_PREFIX}{step:04d}-{uuid.uuid4().hex[:8]}"
        os.rename(self.path(step), aside)
        write_text_atomic(aside / "WHY.txt", why + "\n")
        return aside

    def save(self, step: int, write: Callable[[Path], None], info: dict[str, Any]) -> Path:
        """Let `write` fill a staging folder, record `info`, then rename it into place."""
        final = self.path(step)
        if final.exists():
            raise CheckpointError(
                f"checkpoint {final} already exists and checkpoints are never overwritten: another process trained "
                "this run, or this process's step counter is behind the folder. Register the model again to resume "
                "from the latest checkpoint, or train under another name"
            )
        self.root.mkdir(parents=True, exist_ok=True)
        staging = self.root / f"{_STAGING_PREFIX}{step:04d}-{uuid.uuid4().hex[:8]}"
        staging.mkdir()
        try:
            write(staging)
            write_json_atomic(staging / INFO_FILE, {"step": step, **info})
            fsync_tree(staging)
            os.rename(staging, final)
            fsync_path(self.root)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return final

    def sweep_staging(self) -> None:
        """Remove folders left by a crash in the middle of a save."""
        if self.root.exists():
            for p in self.root.glob(f"{_STAGING_PREFIX}*"):
                shutil.rmtree(p, ignore_errors=True)

    def delete(self, *, keep_last: int = 1, keep: frozenset[int] | set[int] = frozenset()) -> list[int]:
        """Delete checkpoints except the last `keep_last` and the steps in `keep`. The latest is always
        kept (it is the one being served); returns the deleted steps."""
        if keep_last < 1:
            raise ConfigurationError("keep_last must be >= 1: the latest checkpoint is the one being served")
        steps = self.steps()
        deleted = [s for s in steps if s not in set(steps[-keep_last:]) | set(keep)]
        for step in deleted:
            shutil.rmtree(self.path(step))
        return deleted
