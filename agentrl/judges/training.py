"""A judge you train: labelled judgements from any task that has a check, and a RULER judge adapter
taught on them with agentrl's own SFT, on the same base model and backend as the policy.

Data: JSONL, one `JudgeExample` a line: the attempts at one task (message lists, as RULER shows them)
and each attempt's label (the verifiable reward: a code check, a checked answer). Any recorded run
whose groups kept a check makes them (`examples_from_groups`; a RULER run keeps it as
`independent_reward`). Training shows each example in several shuffled orders, so what the judge
learns is the attempts, not their positions; its target answer is RULER's JSON with the labels as
the scores. Check the result with `check_judge` on held-out groups before it judges a policy; while
it judges, its adapter stays at the step it was trained to (it is another model on the backend).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentrl.files import write_text_atomic
from agentrl.judges.check import reference_reward
from agentrl.judges.ruler import DEFAULT_RUBRIC, ruler_prompt
from agentrl.trajectory import History, TrajectoryGroup

if TYPE_CHECKING:
    from agentrl.config import SFTConfig
    from agentrl.model import TrainableModel, TrainResult


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
    """Write examples as JSONL, atomically."""
    path = Path(path)
    write_text_atomic(path, "".join(e.model_dump_json() + "\n" for e in examples))
    return path


def load_examples(path: str | Path) -> list[JudgeExample]:
    """Read a JSONL of examples; a bad line raises `ValueError` naming its file and line number."""
    examples = []
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            examples.append(JudgeExample.model_validate_json(line))
        except ValidationError as error:
            raise ValueError(f"{path}:{number}: not a judge example: {error}") from error
    return examples


def judgement_history(example: JudgeExample, order: list[int]) -> History:
    """The RULER prompt with the attempts shown in `order`, answered with their labels as the scores."""
    shown = [example.message_lists[i] for i in order]
    ranks = sorted(range(len(order)), key=lambda k: -example.labels[order[k]])
    answer = {
        f"trajectory_{k + 1}": {
            "explanation": f"rank {ranks.index(k) + 1} of {len(order)}",
            "score": round(example.labels[i], 3),
        }
        for k, i in enumerate(order)
    }
    messages = ruler_prompt(shown, example.rubric, example.tools)
    return History(messages_and_choices=[*messages, {"role": "assistant", "content": json.dumps(answer)}])


def judge_histories(examples: list[JudgeExample], *, orders: int = 2, seed: int = 0) -> list[History]:
    """Each example shown in `orders` orders (its own first, then shuffles): the demonstrations a judge learns
    from, so that its scores follow the attempts and not where they stand."""
    rng = random.Random(seed)
    histories = []
    for example in examples:
        size = len(example.message_lists)
        for k in range(orders):
            order = list(range(size))
            if k:
                rng.shuffle(order)
            histories.append(judgement_history(example, order))
    return histories


async def train_judge(
    judge: TrainableModel,
    examples: list[JudgeExample],
    config: SFTConfig | None = None,
    *,
    orders: int = 2,
    seed: int = 0,
) -> TrainResult:
    """Teach a registered judge model (a `TrainableModel` on the policy's base model and backend) to
    score like the labels, by SFT on `judge_histories`; returns the SFT step's result."""
    from agentrl.config import SFTConfig

    if not examples:
        raise ValueError(
            "no judge examples: build them with examples_from_groups from groups that kept a check "
            "(their attempts must score differently)"
        )
    return await judge.train_sft(judge_histories(examples, orders=orders, seed=seed), config or SFTConfig())
