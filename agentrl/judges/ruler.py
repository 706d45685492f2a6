"""RULER: an LLM judge ranks all trajectories of a group in one call.

Comparing attempts side by side is easier for a judge than scoring each alone, and GRPO only needs
rewards that are right relative to each other within a group. The prompt gives the context the
trajectories share once (their longest common prefix), then each one's remaining messages under
its id, the tools, and the rubric. The answer is constrained to a JSON schema with one required
entry per trajectory id, validated, and retried (bounded) when unusable.

Layered: `ruler(message_lists, ...)` scores plain message lists; `ruler_score_group(group, ...)`
returns a new group whose rewards are the judge's scores, the old ones kept as
`metrics["independent_reward"]`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model

from agentrl.errors import ConfigurationError, JudgeError
from agentrl.judges.audit import DEFAULT_AUDIT, JudgeAudit, audit_judgements, debiased_scores, pair_audit_metrics
from agentrl.judges.call import InvalidJudgeAnswer, JudgeLimiter, structured_judge_call
from agentrl.judges.pairwise import common_prefix_length, judge_pairs
from agentrl.judges.readout import Readout, check_readout, from_probabilities
from agentrl.model import JudgeModel
from agentrl.rl.ledger import group_tokens
from agentrl.trajectory_group import RolloutException, TrajectoryGroup

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


async def ruler_score_group(  # noqa: C901 - over the limit when the rule came on; split it when next changed
    group: TrajectoryGroup,
    judge_model: JudgeModel,
    *,
    rubric: str = DEFAULT_RUBRIC,
    extra_litellm_params: dict[str, Any] | None = None,
    swallow_exceptions: bool = False,
    debug: bool = False,
    limiter: JudgeLimiter | None = None,
    max_attempts: int = 3,
    audit: JudgeAudit | None = DEFAULT_AUDIT,
    permutations: int = 1,
    readout: Readout = "json",
) -> TrajectoryGroup:
    """A copy of `group` whose rewards are RULER's scores (old rewards kept as `independent_reward`).

    `readout="probabilities"` reads the judge's decisions from its next-token probabilities, every pair in
    both orders (`ruler`); its audit metrics (flip rate and first-position rate over the pairs) then come
    with every group at no extra call, and `metrics["judge_read_from_probabilities"]` says whether the
    judge returned logprobs (1) or was read from JSON (0).

    `permutations` > 1 is debiased RULER: the group is judged in that many orders (its own and shuffled
    ones) and each trajectory's reward is its mean score, so a judge's position bias falls on no one.
    `audit` (a quarter of groups by default; None for none) judges a sampled group once more in a
    shuffled order, or compares two of the debiased orders, and puts the judge's flip rate, position
    bias, self-consistency and agreement with `independent_reward` in the trajectories' metrics
    (`agentrl.judges.audit`); the rewards never depend on it.

    With `swallow_exceptions=True` a failed judgement returns the group emptied of trajectories,
    with the `JudgeError` in its exceptions: it trains on no invented reward, and `model.train`
    counts such groups, reports the last judge error, and raises once judge failures drop too many
    (`TrainConfig.max_judge_failure_rate`), so a judge that never works cannot empty a run quietly.
    """
    if not group.trajectories:
        return group
    if permutations < 1:
        raise ConfigurationError(f"permutations must be at least 1, got {permutations}")
    if permutations > 1 and check_readout(readout) == "probabilities":
        raise ConfigurationError(
            f"permutations={permutations} with readout='probabilities': every pair is already judged in both "
            "orders; leave permutations at 1"
        )
    message_lists = [t.messages() for t in group.trajectories]
    size, key = len(message_lists), json.dumps(message_lists, sort_keys=True, default=str)
    shuffler = audit or JudgeAudit(fraction=0.0)
    orders = [list(range(size))] + [shuffler.order(f"{key}/{k}", size) for k in range(1, permutations)]
    distinct = any(m != message_lists[0] for m in message_lists[1:])  # else the order is moot
    audited = audit is not None and distinct and audit.chooses(key)
    if audited and permutations == 1:
        orders.append(shuffler.order(key, size))

    async def judged_in(order: list[int]) -> RulerResult:
        return await ruler(
            [message_lists[i] for i in order],
            judge_model,
            rubric=rubric,
            tools=group.trajectories[0].tools,
            limiter=limiter,
            max_attempts=max_attempts,
            extra_litellm_params=extra_litellm_params,
            debug=debug,
            readout=readout,
        )

    try:
        results = await asyncio.gather(*(judged_in(order) for order in orders[:permutations]))
    except JudgeError as error:
        if not swallow_exceptions:
            raise
        logger.warning("RULER failed for a group of %d; dropping the group: %s", len(group.trajectories), error)
        failure = RolloutException.from_exception(error, sampled_tokens=group_tokens([group]))  # for the ledger
        return group.with_results([], exceptions=[*group.exceptions, failure])
    scores_G = debiased_scores([(o, r.scores) for o, r in zip(orders, results)], size)
    explanations = results[0].explanations
    audit_metrics: dict[str, float] = {}
    audit_tokens = 0
    # The reward the rollout set, or the check it kept aside for a judge to be measured against.
    independent_G = [t.metrics.get("independent_reward", t.reward) for t in group.trajectories]
    if results[0].order_metrics and audit is not None and distinct:  # both orders of every pair: audited already
        audited = False
        audit_metrics = pair_audit_metrics(results[0].order_metrics, scores_G, independent_G)
    elif audited:
        if permutations == 1:
            try:
                results.append(await judged_in(orders[1]))
                audit_tokens = results[-1].prompt_tokens + results[-1].completion_tokens
            except JudgeError as error:  # the audit is a measurement: its failure costs the group nothing
                logger.info("the audit's second judgement failed; this group is not audited: %s", error)
        if len(results) > 1:
            audit_metrics = audit_judgements(results[0].scores, orders[1], results[1].scores, independent_G).metrics()
    tokens = sum(r.prompt_tokens + r.completion_tokens for r in results)
    costs = [r.cost_usd for r in results if r.cost_usd is not None]
    step_metrics = {
        "ruler_latency_s": results[0].latency_s,
        "ruler_attempts": float(results[0].attempts),
        "judge_tokens": tokens / size,  # a share per trajectory: a step's mean times its trajectories is the total
        **({"judge_audit_tokens": audit_tokens / size} if audited else {}),
        **({"judge_cost_usd": sum(costs) / size} if costs else {}),
        **({"judge_read_from_probabilities": float(results[0].read_from_probabilities)} if readout != "json" else {}),
        **audit_metrics,
    }
    judged = []
    for trajectory, score, explanation in zip(group.trajectories, scores_G, explanations):
        judged.append(
            trajectory.model_copy(
                deep=True,
                update={
                    "reward": score,
                    "metrics": {
                        **trajectory.metrics,
                        "independent_reward": trajectory.reward,
                        "ruler_score": score,
                        **step_metrics,
                    },
                    "logs": [*trajectory.logs, f"{EXPLANATION_LOG}{explanation}"],
                },
            )
        )
    return group.with_results(judged)
