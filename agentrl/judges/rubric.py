"""Rubric judge: several yes/no rubrics about one response, checked in one judge call.

Reinforcement learning with verifiable rubrics: each task comes with statements a good response
satisfies ("The response should compute the total correctly"). The judge returns Yes/No and a
rationale per rubric; the reward is the pass rate. A judgement that fails after its retries raises
`JudgeError`, so the rollout that owns it fails and is counted by the gather's exception budget:
no default score is ever given.

Data: JSONL, one task a line, `{"task_id": ..., "prompt": ..., "rubrics": [...]}`.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from agentrl.client.model import JudgeModel
from agentrl.data.trajectory import Trajectory
from agentrl.foundation.errors import ConfigurationError, JudgeError
from agentrl.judges.audit import DEFAULT_AUDIT, JudgeAudit
from agentrl.judges.call import JudgeLimiter, structured_judge_call
from agentrl.judges.readout import Readout, check_readout, decision_call, from_probabilities

if TYPE_CHECKING:
    from agentrl.client.model import Model

RUBRIC_INSTRUCTIONS = """\
You are a strict grader. Read the task and the response, then decide for each rubric whether the
response satisfies it: "Yes" or "No", with a one-sentence rationale. Judge each rubric on its own.
Answer with JSON only, one entry per rubric id."""
VERDICT_INSTRUCTIONS = """\
You are a strict grader. Read the task, the response and one rubric, then answer with one word:
Yes if the response satisfies the rubric, No if it does not."""
VERDICTS = ("Yes", "No")


class RubricTask(BaseModel):
    """One task: a prompt and the rubrics a good response satisfies."""

    model_config = ConfigDict(extra="forbid")

    task_id: str
    prompt: str = Field(min_length=1)
    rubrics: list[str] = Field(min_length=1)


class RubricVerdict(BaseModel):
    """The judge's decision on one rubric."""

    rubric: str
    passed: bool
    rationale: str
    probability: float | None = None
    """Read from probabilities: the judge's P(Yes) among Yes and No (`passed` is P(Yes) >= 0.5)."""


class RubricJudgement(BaseModel):
    """All verdicts for one response, and the reward they imply."""

    verdicts: list[RubricVerdict]

    @property
    def pass_rate(self) -> float:
        """The share of rubrics passed; read from probabilities, the expected share (the mean P(Yes))."""
        if all(v.probability is not None for v in self.verdicts):
            return sum(v.probability or 0.0 for v in self.verdicts) / len(self.verdicts)
        return sum(v.passed for v in self.verdicts) / len(self.verdicts)


class _RubricAnswer(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rationale: str
    verdict: Literal["Yes", "No"]


TaskT = TypeVar("TaskT", bound=RubricTask)


def load_rubric_tasks(path: str | Path, task_type: type[TaskT] = RubricTask) -> list[TaskT]:  # type: ignore[assignment]
    """Read a JSONL file of rubric tasks (as `task_type`, a RubricTask subclass with more fields);
    a bad line is an error naming its line number, a missing file one naming the path."""
    if not Path(path).is_file():
        raise FileNotFoundError(
            f"no rubric task file at {path}: give a JSONL file, one {{task_id, prompt, rubrics}} a line"
        )
    tasks = []
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            tasks.append(task_type.model_validate(json.loads(line)))
        except (json.JSONDecodeError, ValidationError) as error:
            raise ConfigurationError(
                f"{path}:{number}: not a rubric task ({{task_id, prompt, rubrics}}): {error}"
            ) from error
    if not tasks:
        raise ConfigurationError(f"{path} holds no rubric tasks")
    return tasks


def rubric_prompt(prompt: str, response: str, rubrics: list[str]) -> list[dict[str, str]]:
    listed = "\n".join(f'<rubric id="rubric_{i}">{r}</rubric>' for i, r in enumerate(rubrics, start=1))
    ids = ", ".join(f'"rubric_{i}"' for i in range(1, len(rubrics) + 1))
    user = (
        f"<task>\n{prompt}\n</task>\n<response>\n{response}\n</response>\n<rubrics>\n{listed}\n</rubrics>\n"
        f'Answer with a JSON object with exactly these keys: {ids}; each maps to {{"rationale": ..., "verdict": "Yes" or "No"}}.'
    )
    return [{"role": "system", "content": RUBRIC_INSTRUCTIONS}, {"role": "user", "content": user}]


def verdict_prompt(prompt: str, response: str, rubric: str) -> list[dict[str, str]]:
    """One rubric asked on its own, answered Yes or No in one token (`readout="probabilities"`)."""
    user = (
        f"<task>\n{prompt}\n</task>\n<response>\n{response}\n</response>\n<rubric>\n{rubric}\n</rubric>\n"
        "Does the response satisfy the rubric? Answer Yes or No."
    )
    return [{"role": "system", "content": VERDICT_INSTRUCTIONS}, {"role": "user", "content": user}]


async def _verdicts_from_probabilities(
    prompt: str,
    response: str,
    rubrics: list[str],
    judge_model: JudgeModel,
    limiter: JudgeLimiter | None,
    max_attempts: int,
    extra_litellm_params: dict[str, Any] | None,
) -> RubricJudgement:
    calls = await asyncio.gather(
        *(
            decision_call(
                judge_model,
                verdict_prompt(prompt, response, rubric),
                VERDICTS,
                limiter=limiter,
                max_attempts=max_attempts,
                extra_litellm_params=extra_litellm_params,
            )
            for rubric in rubrics
        )
    )
    return RubricJudgement(
        verdicts=[
            RubricVerdict(
                rubric=rubric,
                passed=call.probabilities["Yes"] >= 0.5,
                rationale=f"P(Yes) = {call.probabilities['Yes']:.3f} (read from probabilities)",
                probability=call.probabilities["Yes"],
            )
            for rubric, call in zip(rubrics, calls)
        ]
    )


async def judge_rubrics(
    prompt: str,
    response: str,
    rubrics: list[str],
    judge_model: JudgeModel,
    *,
    limiter: JudgeLimiter | None = None,
    max_attempts: int = 3,
    extra_litellm_params: dict[str, Any] | None = None,
    readout: Readout = "json",
) -> RubricJudgement:
    """Check every rubric about `response` in one judge call. Raises `JudgeError` when it cannot.

    `readout="probabilities"` asks each rubric on its own and reads P(Yes) from the judge's next-token
    probabilities (no rationale sampled; the pass rate is then the mean P(Yes)) where the judge returns
    logprobs, and reads JSON where it does not (logged once per judge); a `max_tokens` in
    `extra_litellm_params` then bounds only those JSON answers."""
    if not rubrics:
        raise ConfigurationError("judge_rubrics needs at least one rubric")
    if check_readout(readout) == "probabilities":
        read = await from_probabilities(
            judge_model,
            lambda: _verdicts_from_probabilities(
                prompt, response, rubrics, judge_model, limiter, max_attempts, extra_litellm_params
            ),
        )
        if read is not None:
            return read
    fields: dict[str, Any] = {f"rubric_{i}": (_RubricAnswer, ...) for i in range(1, len(rubrics) + 1)}
    schema = create_model("RubricAnswers", __config__=ConfigDict(extra="forbid"), **fields)

    def validate(answer: BaseModel) -> RubricJudgement:
        entries = [getattr(answer, f"rubric_{i}") for i in range(1, len(rubrics) + 1)]
        return RubricJudgement(
            verdicts=[
                RubricVerdict(rubric=r, passed=e.verdict == "Yes", rationale=e.rationale)
                for r, e in zip(rubrics, entries)
            ]
        )

    call = await structured_judge_call(
        judge_model,
        rubric_prompt(prompt, response, rubrics),
        schema,
        validate,
        limiter=limiter,
        max_attempts=max_attempts,
        extra_litellm_params=extra_litellm_params,
    )
    answer: RubricJudgement = call.answer
    return answer


async def audit_rubrics(
    prompt: str,
    response: str,
    judgement: RubricJudgement,
    judge_model: JudgeModel,
    audit: JudgeAudit,
    *,
    limiter: JudgeLimiter | None = None,
    extra_litellm_params: dict[str, Any] | None = None,
) -> dict[str, float]:
    """The rubric judge audited: when `audit` picks this response, its rubrics are judged again in another
    order, and `judge_flip_rate` is the fraction of verdicts that changed (a judge that reads each rubric
    on its own changes none). Empty when not picked, or when the second judgement fails."""
    rubrics = [v.rubric for v in judgement.verdicts]
    key = json.dumps([prompt, response, rubrics])
    if len(rubrics) < 2 or not audit.chooses(key):
        return {}
    order = audit.order(key, len(rubrics))
    try:
        reordered = [rubrics[i] for i in order]
        again = await judge_rubrics(
            prompt, response, reordered, judge_model, limiter=limiter, extra_litellm_params=extra_litellm_params
        )
    except JudgeError:
        return {}
    flips = [again.verdicts[shown].passed != judgement.verdicts[i].passed for shown, i in enumerate(order)]
    return {"judge_audited": 1.0, "judge_flip_rate": sum(flips) / len(flips)}


async def rubric_rollout(
    model: Model,
    task: RubricTask,
    judge_model: JudgeModel,
    *,
    max_tokens: int = 512,
    temperature: float = 1.0,
    limiter: JudgeLimiter | None = None,
    audit: JudgeAudit | None = DEFAULT_AUDIT,
    readout: Readout = "json",
) -> Trajectory:
    """A ready rollout for rubric tasks: answer the prompt, judge it, reward = pass rate.

    Use with `gather_trajectory_groups(..., max_exception_rate=...)`: a failed judgement raises and
    the rollout is skipped and counted. `audit` (a quarter of responses by default; None for none)
    judges a sampled response's rubrics again in another order (`audit_rubrics`); the reward never
    depends on it. With `readout="probabilities"` (`judge_rubrics`) each rubric is asked on its own, so
    their order cannot matter and nothing is audited.
    """
    trajectory = Trajectory(
        messages_and_choices=[{"role": "user", "content": task.prompt}], metadata={"task_id": task.task_id}
    )
    completion = await model.openai_client().chat.completions.create(
        model=model.inference_name,
        messages=cast(Any, trajectory.messages()),
        max_tokens=max_tokens,  # dicts, not TypedDicts
        temperature=temperature,
    )
    choice = completion.choices[0]
    trajectory.messages_and_choices.append(choice)
    judgement = await judge_rubrics(
        task.prompt, choice.message.content or "", task.rubrics, judge_model, limiter=limiter, readout=readout
    )
    trajectory.reward = judgement.pass_rate
    if audit is not None and judgement.verdicts[0].probability is None:
        content = choice.message.content or ""
        trajectory.metrics.update(
            await audit_rubrics(task.prompt, content, judgement, judge_model, audit, limiter=limiter)
        )
    for index, verdict in enumerate(judgement.verdicts, start=1):
        trajectory.metrics[f"rubric_{index}_passed"] = float(verdict.passed)
        trajectory.logs.append(f"rubric {index} ({'Yes' if verdict.passed else 'No'}): {verdict.rationale}")
    return trajectory
