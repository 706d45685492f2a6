"""RULER on a `TrajectoryGroup`: the orders it is judged in (debiased, audited), the judgements (`ruler`), the
audit's figures, and a copy of the group whose rewards are the judge's scores, the old ones kept as
`metrics["independent_reward"]`. Each job is a function of its own; `ruler_score_group` runs them in turn.

What belongs to one trajectory (its score, its independent reward) goes in its metrics; what belongs to the
judgement of the whole group (latency, tokens, cost, the audit) goes in the group's, once (a step line shows
each group figure's mean over its groups as "group/{name}")."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from agentrl.client.model import JudgeModel
from agentrl.data.trajectory_group import RolloutException, TrajectoryGroup
from agentrl.foundation.errors import ConfigurationError, JudgeError
from agentrl.judges.audit import DEFAULT_AUDIT, JudgeAudit, audit_judgements, debiased_scores, pair_audit_metrics
from agentrl.judges.call import JudgeLimiter
from agentrl.judges.readout import Readout, check_readout
from agentrl.judges.ruler import DEFAULT_RUBRIC, EXPLANATION_LOG, RulerResult, ruler
from agentrl.rl.ledger import group_tokens

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class JudgingPlan:
    """The orders a group is judged in: its own first, then `permutations - 1` shuffles, then (audited with one
    permutation) the audit's shuffle; whether its attempts differ at all (else the order is moot)."""

    orders: list[list[int]]
    permutations: int
    distinct: bool
    audited: bool


def judging_plan(message_lists: list[list[dict[str, Any]]], permutations: int, audit: JudgeAudit | None) -> JudgingPlan:
    """The orders, drawn from the group's content (the same group is always judged in the same orders)."""
    size, key = len(message_lists), json.dumps(message_lists, sort_keys=True, default=str)
    shuffler = audit or JudgeAudit(fraction=0.0)
    orders = [list(range(size))] + [shuffler.order(f"{key}/{k}", size) for k in range(1, permutations)]
    distinct = any(m != message_lists[0] for m in message_lists[1:])
    audited = audit is not None and distinct and audit.chooses(key)
    if audited and permutations == 1:
        orders.append(shuffler.order(key, size))
    return JudgingPlan(orders, permutations, distinct, audited)


def check_ruler_settings(permutations: int, readout: Readout) -> None:
    """`ConfigurationError` for permutations RULER cannot use."""
    if permutations < 1:
        raise ConfigurationError(f"permutations must be at least 1, got {permutations}")
    if permutations > 1 and check_readout(readout) == "probabilities":
        raise ConfigurationError(
            f"permutations={permutations} with readout='probabilities': every pair is already judged in both "
            "orders; leave permutations at 1"
        )


@dataclass
class AuditFigures:
    """What the audit measured of a group's judgements (empty when it was not audited), and the tokens it cost."""

    metrics: dict[str, float]
    tokens: int = 0
    audited: bool = False


async def audit_group(
    plan: JudgingPlan,
    results: list[RulerResult],
    scores_G: list[float],
    independent_G: list[float],
    judge_again: Callable[[list[int]], Awaitable[RulerResult]],
    audit: JudgeAudit | None,
) -> AuditFigures:
    """The audit's figures: from the pairs' own two orders where the judge was read from probabilities (no
    extra call), else from a second judgement in the audit's order (`judge_again(order)`; its failure costs the
    group nothing), or from two of the debiased orders. `results` gains the audit's judgement."""
    if results[0].order_metrics and audit is not None and plan.distinct:  # both orders of every pair: audited already
        return AuditFigures(pair_audit_metrics(results[0].order_metrics, scores_G, independent_G))
    if not plan.audited:
        return AuditFigures({})
    tokens = 0
    if plan.permutations == 1:
        try:
            results.append(await judge_again(plan.orders[1]))
            tokens = results[-1].prompt_tokens + results[-1].completion_tokens
        except JudgeError as error:  # the audit is a measurement: its failure costs the group nothing
            logger.info("the audit's second judgement failed; this group is not audited: %s", error)
    metrics = (
        audit_judgements(results[0].scores, plan.orders[1], results[1].scores, independent_G).metrics()
        if len(results) > 1
        else {}
    )
    return AuditFigures(metrics, tokens, audited=True)


def judge_figures(results: list[RulerResult], audit: AuditFigures, readout: Readout) -> dict[str, float]:
    """The group's judgements: latency, attempts, tokens and cost (the group's whole), whether probabilities
    were read, and the audit's metrics."""
    tokens = sum(r.prompt_tokens + r.completion_tokens for r in results)
    costs = [r.cost_usd for r in results if r.cost_usd is not None]
    return {
        "ruler_latency_s": results[0].latency_s,
        "ruler_attempts": float(results[0].attempts),
        "judge_tokens": float(tokens),
        **({"judge_audit_tokens": float(audit.tokens)} if audit.audited else {}),
        **({"judge_cost_usd": sum(costs)} if costs else {}),
        **({"judge_read_from_probabilities": float(results[0].read_from_probabilities)} if readout != "json" else {}),
        **audit.metrics,
    }


def scored_group(
    group: TrajectoryGroup, scores_G: list[float], explanations: list[str], figures: dict[str, float]
) -> TrajectoryGroup:
    """A copy of `group` rewarded with the judge's scores, each old reward kept as `independent_reward`, the
    judgement's `figures` in the group's metrics."""
    judged = [
        trajectory.model_copy(
            deep=True,
            update={
                "reward": score,
                "metrics": {
                    **trajectory.metrics,
                    "independent_reward": trajectory.reward,
                    "ruler_score": score,
                },
                "logs": [*trajectory.logs, f"{EXPLANATION_LOG}{explanation}"],
            },
        )
        for trajectory, score, explanation in zip(group.trajectories, scores_G, explanations)
    ]
    scored = group.with_results(judged)
    scored.metrics = {**group.metrics, **figures}
    return scored


async def ruler_score_group(
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
    with every group at no extra call, and the group's `metrics["judge_read_from_probabilities"]` says
    whether the judge returned logprobs (1) or was read from JSON (0).

    `permutations` > 1 is debiased RULER: the group is judged in that many orders (its own and shuffled
    ones) and each trajectory's reward is its mean score, so a judge's position bias falls on no one.
    `audit` (a quarter of groups by default; None for none) judges a sampled group once more in a
    shuffled order, or compares two of the debiased orders, and puts the judge's flip rate, position
    bias, self-consistency and agreement with `independent_reward` in the group's metrics
    (`agentrl.judges.audit`); the rewards never depend on it.

    With `swallow_exceptions=True` a failed judgement returns the group emptied of trajectories,
    with the `JudgeError` in its exceptions: it trains on no invented reward, and `model.train`
    counts such groups, reports the last judge error, and raises once judge failures drop too many
    (`TrainConfig.max_judge_failure_rate`), so a judge that never works cannot empty a run quietly.
    """
    if not group.trajectories:
        return group
    check_ruler_settings(permutations, readout)
    message_lists = [t.messages() for t in group.trajectories]
    plan = judging_plan(message_lists, permutations, audit)

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
        results = list(await asyncio.gather(*(judged_in(order) for order in plan.orders[:permutations])))
    except JudgeError as error:
        if not swallow_exceptions:
            raise
        logger.warning("RULER failed for a group of %d; dropping the group: %s", len(group.trajectories), error)
        failure = RolloutException.from_exception(error, sampled_tokens=group_tokens([group]))  # for the ledger
        return group.with_results([], exceptions=[*group.exceptions, failure])
    scores_G = debiased_scores([(o, r.scores) for o, r in zip(plan.orders, results)], len(message_lists))
    # The reward the rollout set, or the check it kept aside for a judge to be measured against.
    independent_G = [t.metrics.get("independent_reward", t.reward) for t in group.trajectories]
    figures = await audit_group(plan, results, scores_G, independent_G, judged_in, audit)
    explanations = results[0].explanations
    return scored_group(group, scores_G, explanations, judge_figures(results, figures, readout))
