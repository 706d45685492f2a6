"""Judge checks: before a judge's scores become rewards, measure whether they can be trusted.

`check_judge(groups, judge)` takes groups whose verifiable reward is known (any run's recorded
trajectories: a RULER run keeps the verifiable one as `metrics["independent_reward"]`) and asks
the judge, through RULER, to score each group several times:

- once as recorded: agreement with the reference (pairwise accuracy, Kendall's tau-b, 95%
  intervals from a bootstrap over groups; a judge that guesses sits at 0.5 and 0);
- with the trajectories shuffled (`permutations` orders): score change per trajectory and rank
  flips (order sensitivity), and the mean score at each position in the prompt (position bias);
- again as recorded (`repeats`): score change between identical calls (repeatability);
- cost: latency, tokens, and money where litellm prices the model, per group and per step.

A judge call that fails is counted, never replaced by a score.
"""

from __future__ import annotations

import asyncio
import math
import random
import statistics
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict

from agentrl.client.model import JudgeModel
from agentrl.data.trajectory import Trajectory
from agentrl.data.trajectory_group import TrajectoryGroup
from agentrl.foundation.errors import ConfigurationError, JudgeError
from agentrl.judges.agreement import (
    Estimate,
    kendall_tau_b,
    mean_with_interval,
    pair_counts,
    pairwise_accuracy,
    rank_flip_rate,
)
from agentrl.judges.call import JudgeLimiter, litellm_params
from agentrl.judges.readout import Readout, check_readout
from agentrl.judges.ruler import DEFAULT_RUBRIC, RulerResult, ruler


class Interval(BaseModel):
    """A value with its 95% interval and what it is computed over."""

    model_config = ConfigDict(ser_json_inf_nan="null")

    value: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, estimate: Estimate) -> Interval:
        return cls(value=estimate.value, low=estimate.low, high=estimate.high, n=estimate.n)


class JudgeCheckReport(BaseModel):
    """What one judge did on the checked groups; saved as JSON (NaN, nothing to measure, as null)."""

    model_config = ConfigDict(ser_json_inf_nan="null")

    judge: str
    reference: str
    """Where the verifiable reward came from: "independent_reward" (a judged run) or "reward"."""
    groups: int
    informative_groups: int
    """Groups whose reference reward is not all equal: only these can show agreement."""
    trajectories: int
    pairwise_accuracy: Interval
    """Strictly ordered reference pairs the judge orders the same way (judge tie = half); chance 0.5."""
    kendall_tau: Interval
    """Mean over informative groups of Kendall's tau-b; chance 0."""
    permutations: int
    order_score_change: float
    """Mean |score as recorded - score shuffled| per trajectory."""
    order_rank_flip_rate: float
    """Fraction of pairs whose order differs between the recorded and a shuffled prompt."""
    position_mean_score: list[float]
    """Mean score at prompt position 1, 2, ... over every call (recorded and shuffled)."""
    position_bias: float
    """Mean score at the first position minus the mean over all positions."""
    repeats: int
    repeat_score_change: float
    """Mean |score - score of the same call repeated| per trajectory."""
    repeat_identical_fraction: float
    """Fraction of repeated calls that gave exactly the same scores."""
    calls: int
    failed_calls: int
    latency_s_mean: float
    latency_s_p90: float
    prompt_tokens_per_group: float
    completion_tokens_per_group: float
    usd_per_group: float | None
    """From litellm's price map; None where the judge has no price (a local server)."""
    groups_per_step: int
    usd_per_step: float | None
    readout: str = "json"
    """How the decisions were read: "json", "probabilities" (pair by pair from next-token probabilities, where
    the position flips and bias are those of the pairs' two orders too), or "mixed" (some calls fell back)."""


def reference_reward(trajectory: Trajectory) -> float:
    """The verifiable reward: `metrics["independent_reward"]` where a judge replaced it, else `reward`."""
    return float(trajectory.metrics.get("independent_reward", trajectory.reward))


def judge_label(judge: JudgeModel) -> str:
    params = litellm_params(judge)
    where = params.get("base_url") or params.get("api_base")
    return f"{params['model']} at {where}" if where else str(params["model"])


@dataclass
class _GroupCalls:
    """Every call made for one group, scores mapped back to the recorded order."""

    recorded: list[float] | None = None
    shuffled: list[list[float]] = field(default_factory=list)
    repeated: list[list[float]] = field(default_factory=list)
    by_position: list[tuple[int, float]] = field(default_factory=list)
    results: list[RulerResult] = field(default_factory=list)
    failures: int = 0


async def _judge_group(
    group: TrajectoryGroup,
    judge: JudgeModel,
    rng: random.Random,
    settings: dict[str, Any],
    permutations: int,
    repeats: int,
) -> _GroupCalls:
    messages = [t.messages() for t in group.trajectories]
    size = len(messages)
    orders = [list(range(size))]
    for _ in range(permutations):
        order = list(range(size))
        while order == orders[0] and size > 1:  # a shuffle that changes nothing measures nothing
            rng.shuffle(order)
        orders.append(order)
    orders += [list(range(size))] * repeats
    rubric = group.metadata.get("rubric")  # a judge example's own rubric (JudgeExample.group)
    if isinstance(rubric, str):
        settings = {**settings, "rubric": rubric}
    outcomes = await asyncio.gather(
        *(
            ruler([messages[i] for i in order], judge, tools=group.trajectories[0].tools, **settings)
            for order in orders
        ),
        return_exceptions=True,
    )
    calls = _GroupCalls()
    for index, (order, outcome) in enumerate(zip(orders, outcomes)):
        if isinstance(outcome, JudgeError):
            calls.failures += 1
            continue
        if isinstance(outcome, BaseException):
            raise outcome
        calls.results.append(outcome)
        scores = [0.0] * size
        for position, (original, score) in enumerate(zip(order, outcome.scores)):
            scores[original] = score
            calls.by_position.append((position, score))
        if index == 0:
            calls.recorded = scores
        elif index <= permutations:
            calls.shuffled.append(scores)
        else:
            calls.repeated.append(scores)
    return calls


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else math.nan


def _changes(recorded: list[float], others: list[list[float]]) -> list[float]:
    return [abs(a - b) for other in others for a, b in zip(recorded, other)]


async def check_judge(
    groups: list[TrajectoryGroup],
    judge: JudgeModel,
    *,
    rubric: str = DEFAULT_RUBRIC,
    permutations: int = 2,
    repeats: int = 1,
    groups_per_step: int | None = None,
    seed: int = 0,
    limiter: JudgeLimiter | None = None,
    max_attempts: int = 3,
    extra_litellm_params: dict[str, Any] | None = None,
    readout: Readout = "json",
) -> JudgeCheckReport:
    """Judge `groups` with RULER as recorded, shuffled and repeated, and report agreement, bias and cost.
    `readout="probabilities"` checks the judge as `ruler(..., readout="probabilities")` uses it.

    A group whose `metadata["rubric"]` is set (held-out judge examples) is judged with that rubric.

    `groups_per_step` (default: all the groups given) turns cost per group into cost per training step.
    """
    usable = [g for g in groups if len(g.trajectories) >= 2]
    if not usable:
        raise ConfigurationError("judge check needs groups of at least 2 trajectories; none were given")
    if permutations < 1 or repeats < 0:
        raise ConfigurationError(f"permutations must be >= 1 and repeats >= 0, got {permutations} and {repeats}")
    settings = {
        "rubric": rubric,
        "limiter": limiter,
        "max_attempts": max_attempts,
        "extra_litellm_params": extra_litellm_params,
        "readout": check_readout(readout),
    }
    rng = random.Random(seed)
    calls_G = await asyncio.gather(
        *(_judge_group(g, judge, random.Random(rng.random()), settings, permutations, repeats) for g in usable)
    )
    references_G = [[reference_reward(t) for t in g.trajectories] for g in usable]
    judged = [(ref, c) for ref, c in zip(references_G, calls_G) if c.recorded is not None]
    informative = [(ref, c.recorded) for ref, c in judged if c.recorded is not None and len(set(ref)) > 1]
    positions: dict[int, list[float]] = {}
    for c in calls_G:
        for position, score in c.by_position:
            positions.setdefault(position, []).append(score)
    position_means = [_mean(positions[p]) for p in sorted(positions)]
    all_scores = [s for c in calls_G for _, s in c.by_position]
    results = [r for c in calls_G for r in c.results]
    latencies = sorted(r.latency_s for r in results)
    # Training judges a group with one call, so a call's cost is the cost per group.
    prices = [r.cost_usd for r in results if r.cost_usd is not None]
    usd_per_group = _mean(prices) if results and len(prices) == len(results) else None
    step_groups = groups_per_step or len(usable)
    repeated = [(c.recorded, r) for _, c in judged for r in c.repeated if c.recorded is not None]
    return JudgeCheckReport(
        judge=judge_label(judge),
        reference="independent_reward"
        if any("independent_reward" in t.metrics for g in usable for t in g.trajectories)
        else "reward",
        groups=len(usable),
        informative_groups=len(informative),
        trajectories=sum(len(g.trajectories) for g in usable),
        pairwise_accuracy=Interval.of(pairwise_accuracy([pair_counts(ref, s) for ref, s in informative])),
        kendall_tau=Interval.of(mean_with_interval([kendall_tau_b(ref, s) for ref, s in informative])),
        permutations=permutations,
        order_score_change=_mean([d for _, c in judged for d in _changes(c.recorded or [], c.shuffled)]),
        order_rank_flip_rate=_mean([rank_flip_rate(c.recorded or [], s) for _, c in judged for s in c.shuffled]),
        position_mean_score=position_means,
        position_bias=position_means[0] - _mean(all_scores) if position_means else math.nan,
        repeats=repeats,
        repeat_score_change=_mean([d for recorded, r in repeated for d in _changes(recorded, [r])]),
        repeat_identical_fraction=_mean([float(recorded == r) for recorded, r in repeated]),
        calls=sum(len(c.results) + c.failures for c in calls_G),
        failed_calls=sum(c.failures for c in calls_G),
        latency_s_mean=_mean(latencies),
        latency_s_p90=latencies[int(0.9 * (len(latencies) - 1))] if latencies else math.nan,
        prompt_tokens_per_group=_mean([r.prompt_tokens for r in results]),
        completion_tokens_per_group=_mean([r.completion_tokens for r in results]),
        usd_per_group=usd_per_group,
        groups_per_step=step_groups,
        usd_per_step=usd_per_group * step_groups if usd_per_group is not None else None,
        readout=_readout_used([r.read_from_probabilities for r in results]),
    )


def _readout_used(read_from_probabilities: list[bool]) -> str:
    if read_from_probabilities and all(read_from_probabilities):
        return "probabilities"
    return "mixed" if any(read_from_probabilities) else "json"
