"""Instruction-following tasks with rubrics, written for a small model's level, and how to check them.

Each task is a short writing instruction (a thank-you note, a reminder, a list of tips, a reply to a
customer) with 3-4 yes/no rubrics. The shipped file also carries, per rubric, the same criterion
reworded (`eval_rubrics`: held-out evaluation asks the judge in other words than training did) and,
where a rubric can be checked by code (word counts, bullets, a name or a date mentioned), that check
(`checks`). Checks are never a reward: they measure the judge and the policy independently.

`python -m agentrl_environments.rubric.generate` rewrites data/train.jsonl and data/test.jsonl (seeded).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agentrl.judges import RubricTask

DATA = Path(__file__).resolve().parent / "data"


class Check(BaseModel):
    """A rubric verified by code: `contains` (any of `values`, case-insensitive), `max_words`,
    `bullets` (exactly `count` lines starting with "- ", "* " or "1."), `sentences` (exactly `count`)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["contains", "max_words", "bullets", "sentences"]
    values: list[str] = Field(default_factory=list)
    count: int = 0


class InstructionTask(RubricTask):
    """A rubric task with optional reworded rubrics for evaluation and code checks (None: not checkable)."""

    eval_rubrics: list[str] | None = None
    checks: list[Check | None] | None = None

    @model_validator(mode="after")
    def _aligned(self) -> InstructionTask:
        for name in ("eval_rubrics", "checks"):
            given = getattr(self, name)
            if given is not None and len(given) != len(self.rubrics):
                raise ValueError(f"{name} must have one entry per rubric ({len(self.rubrics)}), got {len(given)}")
        return self


def words(text: str) -> int:
    return len(re.findall(r"\b[\w'$.,:-]+\b", text))


def bullet_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if re.match(r"\s*([-*•]|\d+[.)])\s+\S", line)]


def sentences(text: str) -> int:
    return len(re.findall(r"[^.!?]*[A-Za-z0-9][^.!?]*[.!?]+", text.replace("\n", " ")))


def passes(check: Check, response: str) -> bool:
    if check.kind == "contains":
        return any(v.lower() in response.lower() for v in check.values)
    if check.kind == "max_words":
        return 0 < words(response) <= check.count
    if check.kind == "bullets":
        return len(bullet_lines(response)) == check.count
    return sentences(response) == check.count


def checked_pass_rate(task: InstructionTask, response: str) -> float | None:
    """The fraction of the code-checkable rubrics that `response` passes (None: nothing checkable)."""
    results = [passes(c, response) for c in task.checks or [] if c is not None]
    return sum(results) / len(results) if results else None


# --- the generator ---
