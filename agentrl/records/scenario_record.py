"""Which scenarios each step consumed: the run's record that keeps training data exactly-once across crashes.

A group names its scenario in `metadata["scenario"]` ("{epoch}:{id}", set by `DatasetBatch.groups`).
`scenarios.jsonl` in the run folder is append-only, one line per event:

- `{"step": S, "scenarios": [...]}` written by `TrainableModel.train` *before* the backend trains, tagged
  with the step the update would become (S = current + 1): a write-ahead line. Until checkpoint S
  commits it counts for nothing, so a kill before the commit leaves those scenarios untrained, and the
  resumed run samples them again; a kill after it leaves them trained, never repeated.
- `{"void_after": C}` when a model registers on a run folder that already has a record (C: the step it
  resumes at), when a train call returns without a new step or raises, and before the first call after
  a cancelled one (C: the backend's step): every earlier line tagged after C is void (its step never
  committed, and a later line may reuse its number).
- The same scenarios line tagged with the unchanged step, after that void, when the backend skipped the
  step (every group had equal rewards): a skipped step consumed its scenarios too, it only had nothing
  to learn from them.

`trained_scenarios` replays the lines and keeps those tagged at or before the committed step.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from agentrl.data.trajectory_group import TrajectoryGroup
from agentrl.foundation.files import append_line, read_lines

SCENARIO = "scenario"
"""The `TrajectoryGroup.metadata` key naming the group's scenario ("{epoch}:{id}")."""


def scenario_key(epoch: int, scenario_id: str | int) -> str:
    """A scheduled scenario: the same scenario in another epoch is another key."""
    return f"{epoch}:{scenario_id}"


def group_scenarios(groups: Iterable[TrajectoryGroup]) -> list[str]:
    """The scenario keys of the groups that carry one."""
    return [str(group.metadata[SCENARIO]) for group in groups if SCENARIO in group.metadata]


def record_step(path: Path, step: int, keys: list[str]) -> None:
    """Append that `keys` were consumed by the step that is (or will be, once committed) `step`."""
    append_line(path, {"step": step, "scenarios": keys})


def void_after(path: Path, step: int) -> None:
    """The committed step is `step` (a restart, a skipped or failed step): void every earlier line tagged after it."""
    if path.exists():
        append_line(path, {"void_after": step})


def trained_scenarios(path: Path, committed_step: int) -> dict[str, list[int]]:
    """Each consumed scenario key and the steps that consumed it (one, unless something went wrong)."""
    if not path.exists():
        return {}
    events: list[tuple[int, list[str]]] = []
    for line in read_lines(path):
        if isinstance(line.get("void_after"), int):
            events = [(step, keys) for step, keys in events if step <= line["void_after"]]
        elif isinstance(line.get("step"), int) and isinstance(line.get("scenarios"), list):
            events.append((line["step"], [str(key) for key in line["scenarios"]]))
    trained: dict[str, list[int]] = {}
    for step, keys in events:
        if step <= committed_step:
            for key in keys:
                trained.setdefault(key, []).append(step)
    return trained
