"""RULER: an LLM judge ranks all trajectories of a group in one call.

Comparing attempts side by side is easier for a judge than scoring each alone, and GRPO only needs
rewards that are right relative to each other within a group. The prompt gives the context the
trajectories share once (their longest common prefix), then each one's remaining messages under
its id, the tools, and the rubric. The answer is constrained to a JSON schema with one required
entry per trajectory id, validated, and retried (bounded) when unusable.

`ruler(message_lists, ...)` scores plain message lists; `agentrl.judges.ruler_group.ruler_score_group` scores a
`TrajectoryGroup` with it.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model

from agentrl.client.model import JudgeModel
from agentrl.foundation.errors import ConfigurationError
from agentrl.judges.call import InvalidJudgeAnswer, JudgeLimiter, structured_judge_call
from agentrl.judges.pairwise import common_prefix_length, judge_pairs
from agentrl.judges.readout import Readout, check_readout, from_probabilities

logger = logging.getLogger(__name__)
EXPLANATION_LOG = "RULER: "
"""How a judged trajectory's log line with RULER's explanation starts."""

DEFAULT_RUBRIC = """\
- A trajectory that achieves its goal always scores far higher than one that does not.
- Among trajectories that achieve the goal, the one that gets there more efficiently (fewer steps, no needless detours or errors) scores higher.
- Make score gaps proportional: two nearly equal trajectories get nearly equal scores; a much better one gets a much higher score.
- Give partial credit for real progress toward the goal, even when the goal is not reached."""

JUDGE_INSTRUCTIONS = """\
You are an impartial judge. Several AI agents attempted the same task; each attempt is a trajectory.
Compare them against each other and the rubric, then give each trajectory a score between 0 and 1
and a one-sentence explanation. Answer with JSON only, one entry per trajectory id."""

# A judge's 1.0000001 is a rounding slip and is clamped; anything further out is a wrong answer.
SCORE_TOLERANCE = 1e-3


class TrajectoryScore(BaseModel):
    """The judge's verdict on one trajectory."""

    model_config = ConfigDict(extra="forbid")

    explanation: str
    score: float = Field(json_schema_extra={"minimum": 0, "maximum": 1})


@dataclass(frozen=True)
class RulerResult:
    """Scores in [0, 1] and explanations, aligned with the input message lists."""

    scores: list[float]
    explanations: list[str]
    attempts: int
    latency_s: float
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = None
    """From litellm's price map; None where the judge has no price (a local server)."""
    read_from_probabilities: bool = False
    """Scored pair by pair from next-token probabilities (`agentrl.judges.pairwise`), not from sampled JSON."""
    order_metrics: dict[str, float] = field(default_factory=dict)
    """Read from probabilities: the pairs' `judge_pair_flip_rate` and `judge_first_position_rate`, measured for free
    (the reward itself does not depend on the order shown, so the audit's `judge_flip_rate` does not apply)."""


def _render(messages: list[dict[str, Any]]) -> str:
    return "\n".join(json.dumps(m, ensure_ascii=False) for m in messages)


def ruler_prompt(
    message_lists: list[list[dict[str, Any]]], rubric: str, tools: list[dict[str, Any]] | None
) -> list[dict[str, str]]:
    """The judge's messages: shared context once, then each trajectory's own messages by id."""
    shared = common_prefix_length(message_lists)
    parts = [f"<context>\n{_render(message_lists[0][:shared])}\n</context>"]
    if tools:
        parts.append(f"<tools>\n{json.dumps(tools, ensure_ascii=False)}\n</tools>")
    parts.append("<trajectories>")
    for index, messages in enumerate(message_lists, start=1):
        parts.append(f'<trajectory id="trajectory_{index}">\n{_render(messages[shared:])}\n</trajectory>')
    parts.append("</trajectories>")
    parts.append(f"<rubric>\n{rubric}\n</rubric>")
    ids = ", ".join(f'"trajectory_{i}"' for i in range(1, len(message_lists) + 1))
    parts.append(
        f'Answer with a JSON object with exactly these keys: {ids}; each maps to {{"explanation": ..., "score": ...}}.'
    )
    return [{"role": "system", "content": JUDGE_INSTRUCTIONS}, {"role": "user", "content": "\n".join(parts)}]


def scores_schema(count: int) -> type[BaseModel]:
    """A schema with one required entry per trajectory id, so the count is fixed by construction."""
    fields: dict[str, Any] = {f"trajectory_{i}": (TrajectoryScore, ...) for i in range(1, count + 1)}
    return create_model("RulerScores", __config__=ConfigDict(extra="forbid"), **fields)


def _valid_score(trajectory_id: str, score: float) -> float:
    if not math.isfinite(score):
        raise InvalidJudgeAnswer(f"{trajectory_id}: score {score} is not finite")
    if -SCORE_TOLERANCE <= score < 0 or 1 < score <= 1 + SCORE_TOLERANCE:
        return min(max(score, 0.0), 1.0)
    if not 0 <= score <= 1:
        raise InvalidJudgeAnswer(f"{trajectory_id}: score {score} is outside [0, 1]")
    return score


async def ruler(
    message_lists: list[list[dict[str, Any]]],
    judge_model: JudgeModel,
    *,
    rubric: str = DEFAULT_RUBRIC,
    tools: list[dict[str, Any]] | None = None,
    limiter: JudgeLimiter | None = None,
    max_attempts: int = 3,
    extra_litellm_params: dict[str, Any] | None = None,
    debug: bool = False,
    readout: Readout = "json",
) -> RulerResult:
    """Score message lists relative to each other in one judge call. Raises `JudgeError` when it cannot.

    `readout="probabilities"` scores them pair by pair from the judge's next-token probabilities
    (`agentrl.judges.pairwise`, no explanations sampled) where the judge returns logprobs, and from JSON
    where it does not (logged once per judge; `RulerResult.read_from_probabilities` says which); a
    `max_tokens` in `extra_litellm_params` then bounds only those JSON answers (a decision is one token)."""
    if not message_lists:
        raise ConfigurationError("ruler needs at least one message list")
    check_readout(readout)
    identical = all(m == message_lists[0] for m in message_lists[1:])
    if readout == "probabilities" and identical:  # every pair a tie, by definition: no call to make
        ties = len(message_lists)
        return RulerResult([0.5] * ties, ["identical attempts: a tie"] * ties, 0, 0.0, read_from_probabilities=True)
    if identical and len(message_lists) > 1:
        # Identical attempts deserve identical scores: judge one, copy it.
        single = await ruler(
            message_lists[:1],
            judge_model,
            rubric=rubric,
            tools=tools,
            limiter=limiter,
            max_attempts=max_attempts,
            extra_litellm_params=extra_litellm_params,
            debug=debug,
        )
        n = len(message_lists)
        return replace(single, scores=single.scores * n, explanations=single.explanations * n)
    if readout == "probabilities":
        by_pairs = await from_probabilities(
            judge_model,
            lambda: _ruler_by_pairs(
                message_lists, judge_model, rubric, tools, limiter, max_attempts, extra_litellm_params
            ),
        )
        if by_pairs is not None:
            return by_pairs
    schema = scores_schema(len(message_lists))

    def validate(answer: BaseModel) -> list[tuple[float, str]]:
        entries = [getattr(answer, f"trajectory_{i}") for i in range(1, len(message_lists) + 1)]
        return [(_valid_score(f"trajectory_{i}", e.score), e.explanation) for i, e in enumerate(entries, start=1)]

    messages = ruler_prompt(message_lists, rubric, tools)
    if debug:
        logger.info("RULER prompt:\n%s", messages[1]["content"])
    call = await structured_judge_call(
        judge_model,
        messages,
        schema,
        validate,
        limiter=limiter,
        max_attempts=max_attempts,
        extra_litellm_params=extra_litellm_params,
    )
    if debug:
        logger.info("RULER answer: %s", call.answer)
    return RulerResult(
        [s for s, _ in call.answer],
        [e for _, e in call.answer],
        call.attempts,
        call.latency_s,
        call.prompt_tokens,
        call.completion_tokens,
        call.cost_usd,
    )


async def _ruler_by_pairs(
    message_lists: list[list[dict[str, Any]]],
    judge_model: JudgeModel,
    rubric: str,
    tools: list[dict[str, Any]] | None,
    limiter: JudgeLimiter | None,
    max_attempts: int,
    extra_litellm_params: dict[str, Any] | None,
) -> RulerResult:
    started = time.perf_counter()
    judged = await judge_pairs(
        message_lists,
        judge_model,
        rubric=rubric,
        tools=tools,
        limiter=limiter,
        max_attempts=max_attempts,
        extra_litellm_params=extra_litellm_params,
    )
    costs = [c.cost_usd for c in judged.calls if c.cost_usd is not None]
    others = len(message_lists) - 1
    return RulerResult(
        scores=judged.scores,
        explanations=[
            f"preferred in {s * others:.2f} of {others} comparisons (read from probabilities)" for s in judged.scores
        ],
        attempts=sum(c.attempts for c in judged.calls),
        latency_s=time.perf_counter() - started,  # the pairs are asked concurrently
        prompt_tokens=sum(c.prompt_tokens for c in judged.calls),
        completion_tokens=sum(c.completion_tokens for c in judged.calls),
        cost_usd=sum(costs) if costs else None,
        read_from_probabilities=True,
        order_metrics={
            "judge_pair_flip_rate": judged.flip_rate,
            "judge_first_position_rate": judged.first_position_rate,
        },
    )
