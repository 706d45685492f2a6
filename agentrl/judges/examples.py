"""Labelled judgements, the data a judge is checked on and trained on (`agentrl.judge_training`), JSONL one a line:
`JudgeExample`, the attempts at one task and the score each deserves (its verifiable check; `JudgeExample.group`
to check a RULER judge), and `VerdictExample`, one rubric's verdict on one response (a rubric judge's)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentrl.data.trajectory import Trajectory
from agentrl.data.trajectory_group import TrajectoryGroup
from agentrl.foundation.errors import ConfigurationError
from agentrl.foundation.files import write_text_atomic
from agentrl.judges.check import reference_reward
from agentrl.judges.rubric import verdict_prompt
from agentrl.judges.ruler import DEFAULT_RUBRIC

_Example = TypeVar("_Example", bound=BaseModel)


class JudgeExample(BaseModel):
    """One labelled judgement: attempts at one task and the score each deserves (its check)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    message_lists: list[list[dict[str, Any]]] = Field(min_length=2)
    """The attempts, each the messages RULER would show (shared context first)."""
    labels: list[float]
    """The verifiable reward of each attempt, in [0, 1]: what the judge should score."""
    rubric: str = DEFAULT_RUBRIC
    tools: list[dict[str, Any]] | None = None
    source: str = ""
    """Where it came from (run and step), for the record."""

    def model_post_init(self, _: Any) -> None:
        if len(self.labels) != len(self.message_lists):
            raise ValueError(f"{len(self.labels)} labels for {len(self.message_lists)} attempts: give one each")
        if any(not 0.0 <= label <= 1.0 for label in self.labels):
            raise ValueError(f"labels must lie in [0, 1] (RULER's scale), got {self.labels}")

    def group(self) -> TrajectoryGroup:
        """The attempts as a group with the labels as rewards and the rubric in its metadata, as
        `check_judge` takes it (held-out examples measure a judge)."""
        return TrajectoryGroup(
            (
                Trajectory(messages_and_choices=list(m), reward=label, tools=self.tools)
                for m, label in zip(self.message_lists, self.labels)
            ),
            metadata={"rubric": self.rubric},
        )


def examples_from_groups(
    groups: list[TrajectoryGroup], *, rubric: str = DEFAULT_RUBRIC, source: str = ""
) -> list[JudgeExample]:
    """Judge examples from groups that kept a verifiable reward (`independent_reward`, else `reward`),
    clipped to [0, 1]; groups whose attempts all score alike teach no ordering and are left out."""
    examples = []
    for group in groups:
        labels = [min(max(reference_reward(t), 0.0), 1.0) for t in group.trajectories]
        if len(labels) < 2 or len(set(labels)) < 2:
            continue
        message_lists = [t.messages() for t in group.trajectories]
        tools = group.trajectories[0].tools
        examples.append(
            JudgeExample(message_lists=message_lists, labels=labels, rubric=rubric, tools=tools, source=source)
        )
    return examples


def write_examples(path: str | Path, examples: list[JudgeExample]) -> Path:
    """Write judge examples as JSONL, atomically."""
    return _write_jsonl(path, examples)


def load_examples(path: str | Path) -> list[JudgeExample]:
    """Read a JSONL of judge examples; a bad line raises `ConfigurationError` naming its file and line number."""
    return _load_jsonl(path, JudgeExample, "a judge example")


class VerdictExample(BaseModel):
    """One labelled verdict: a task, one response to it, one rubric, and whether the response passes it."""

    model_config = ConfigDict(extra="forbid")

    prompt: str = Field(min_length=1)
    response: str
    rubric: str = Field(min_length=1)
    passed: bool
    source: str = ""
    """Where it came from (task, answer), for the record."""

    def messages(self) -> list[dict[str, str]]:
        return verdict_prompt(self.prompt, self.response, self.rubric)


def write_verdict_examples(path: str | Path, examples: list[VerdictExample]) -> Path:
    """Write verdict examples as JSONL, atomically."""
    return _write_jsonl(path, examples)


def load_verdict_examples(path: str | Path) -> list[VerdictExample]:
    """Read a JSONL of verdict examples; a bad line raises `ConfigurationError` naming its file and line."""
    return _load_jsonl(path, VerdictExample, "a verdict example")


def _write_jsonl(path: str | Path, examples: Sequence[BaseModel]) -> Path:
    path = Path(path)
    write_text_atomic(path, "".join(e.model_dump_json() + "\n" for e in examples))
    return path


def _load_jsonl(path: str | Path, kind: type[_Example], what: str) -> list[_Example]:
    examples = []
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if line.strip():
            try:
                examples.append(kind.model_validate_json(line))
            except ValidationError as error:
                raise ConfigurationError(f"{path}:{number}: not {what}: {error}") from error
    return examples
