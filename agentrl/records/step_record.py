"""A committed step's record kept in its checkpoint, so a crash between the commit and the run's records loses
nothing.

`ModelSession.commit` renames the checkpoint into place, swaps the served adapter, and only then appends the
step's line to metrics.jsonl and writes its trajectories and transcript. A kill in that gap would leave a
trained step without its records. So the checkpoint also holds the step's trajectories (`STEP_RECORD_FILE`)
and, in its info, the step's metrics and split; resuming writes the records of any committed step after the
last recorded one again from there (`backfill_records`), marked `"backfilled": true`.
"""

from __future__ import annotations

import gzip
import logging
from pathlib import Path

from agentrl.data.trajectory_group import TrajectoryGroup
from agentrl.foundation.errors import CheckpointError
from agentrl.foundation.files import gunzip_bounded
from agentrl.records.checkpoints import MAX_RECORD_BYTES, STEP_RECORD_FILE, CheckpointStore
from agentrl.records.step_metrics import step_line
from agentrl.records.tracking import groups_from_rows, read_metrics, record_step, trajectory_lines

logger = logging.getLogger(__name__)


def write_step_record(folder: Path, groups: list[TrajectoryGroup]) -> None:
    """The step's trajectories into `folder` (a checkpoint being staged), gzip-compressed JSON lines."""
    text = "".join(line + "\n" for line in trajectory_lines(groups))
    (folder / STEP_RECORD_FILE).write_bytes(gzip.compress(text.encode(), mtime=0))


def read_step_record(folder: Path) -> list[TrajectoryGroup]:
    """The trajectories `write_step_record` kept ([] for a checkpoint written before it existed)."""
    import json

    path = folder / STEP_RECORD_FILE
    if not path.exists():
        return []
    lines = gunzip_bounded(path.read_bytes(), MAX_RECORD_BYTES, str(path)).decode().splitlines()
    return groups_from_rows([json.loads(line) for line in lines if line.strip()])


def unrecorded_steps(run_dir: Path) -> list[int]:
    """Committed steps after the last step metrics.jsonl records (with no line at all, after the run's first
    checkpoint: step 0, or the step a fork started from): those a crash after the commit left without records."""
    steps = CheckpointStore(run_dir).steps()
    recorded = [r["step"] for r in read_metrics(run_dir) if isinstance(r.get("step"), int)]
    last = max(recorded) if recorded else min(steps, default=0)
    return [step for step in steps if step > last]


def backfill_records(run_dir: Path) -> list[int]:
    """Write the records (metrics line, trajectories, transcript, plots) of every `unrecorded_steps` step again
    from its checkpoint; returns those steps. A checkpoint whose info is unreadable is left to resume's checks."""
    store = CheckpointStore(run_dir)
    done = []
    for step in unrecorded_steps(run_dir):
        try:
            info = store.info(step)
        except CheckpointError:
            continue
        groups = read_step_record(store.path(step))
        metrics = {k: v for k, v in dict(info.get("metrics", {})).items() if isinstance(v, (int, float))}
        split = str(info.get("split", "train"))
        record_step(run_dir, step, split, groups, {**step_line(metrics, groups, skipped=False), "backfilled": True})
        logger.warning(
            "step %d of %s was committed but its records were lost (a crash right after the commit): written again "
            "from its checkpoint", step, run_dir,
        )  # fmt: skip
        done.append(step)
    return done
