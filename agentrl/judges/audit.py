"""The judge audited while it trains: a sampled fraction of RULER groups is judged again in another
order, and what changed is measured, so a run shows whether its reward comes from a fair judge.

Per audited group (all pure functions of the two judgements; the group's rewards never change):
- `judge_flip_rate`: the fraction of trajectory pairs whose order (or tie) differs between the two
  orders of presentation. A judge that reads the trajectories flips few; one that guesses flips
  about half (2/3 with ties in play).
- `judge_first_position_rate`: the fraction of judgements in which the trajectory shown first got
  the top score alone; 1/G (`judge_first_position_chance`) for a judge without position bias.
- `judge_self_consistency`: Kendall's tau-b between the two judgements, aligned (1: same order).
- `judge_independent_tau`: Kendall's tau-b between the judge's scores and the reward the rollout set
  itself (`metrics["independent_reward"]`, a verifiable check), where that reward varies in the group.
These become trajectory metrics, so every step's metrics.jsonl, W&B and `agentrl show` average them
over the audited groups; `judge_audited` says which groups were.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from agentrl.judges.agreement import kendall_tau_b, rank_flip_rate


class JudgeAudit(BaseModel):
    """How much of a run's judging is audited: `fraction` of groups judged again in a shuffled order
    (their extra judge calls are the audit's cost, reported as `judge_audit_tokens`)."""

    model_config = ConfigDict(extra="forbid")

    fraction: float = Field(0.25, ge=0.0, le=1.0)
    seed: int | None = None
    """Which groups and orders: None draws afresh each time; a number repeats them."""

    def chooses(self, group_key: str) -> bool:
        """Whether the group (named by its content) is audited: the same group always gets the same answer."""
        return self.fraction > 0 and _rng(self.seed, group_key).random() < self.fraction

    def order(self, group_key: str, size: int) -> list[int]:
        """A presentation order for the audit's second judgement, never the original one (size > 1)."""
        rng = _rng(self.seed, group_key + "/order")
        order = list(range(size))
        while size > 1 and order == list(range(size)):
            rng.shuffle(order)
        return order


DEFAULT_AUDIT = JudgeAudit()
"""A quarter of the groups (RULER) or responses (rubric judge) judged again in another order; pass
`audit=None` to judge each once."""


def _rng(seed: int | None, key: str) -> random.Random:
    return random.Random(f"{seed}:{key}") if seed is not None else random.Random()


@dataclass(frozen=True)
class AuditResult:
    """The audit of one group: two judgements of the same trajectories, in two orders."""

    flip_rate: float
    first_position_rate: float
    first_position_chance: float
    self_consistency: float
    independent_tau: float | None

    def metrics(self) -> dict[str, float]:
        metrics = {
            "judge_audited": 1.0,
            "judge_flip_rate": self.flip_rate,
            "judge_first_position_rate": self.first_position_rate,
            "judge_first_position_chance": self.first_position_chance,
            "judge_self_consistency": self.self_consistency,
        }
        if self.independent_tau is not None:
            metrics["judge_independent_tau"] = self.independent_tau
        return metrics


def _first_shown_on_top(scores_in_shown_order: Sequence[float]) -> float:
    top = max(scores_in_shown_order)
    return 1.0 if scores_in_shown_order[0] == top and scores_in_shown_order.count(top) == 1 else 0.0


def audit_judgements(
    scores_G: Sequence[float],
    order: Sequence[int],
    reordered_scores: Sequence[float],
    independent_G: Sequence[float] | None = None,
) -> AuditResult:
    """Compare a judgement of a group in its own order (`scores_G`) with one of the same trajectories
    shown in `order` (`reordered_scores[k]` is the score of trajectory `order[k]`)."""
    aligned_G = [0.0] * len(scores_G)
    for shown, trajectory in enumerate(order):
        aligned_G[trajectory] = reordered_scores[shown]
    varies = independent_G is not None and len(set(independent_G)) > 1
    return AuditResult(
        flip_rate=rank_flip_rate(scores_G, aligned_G),
        first_position_rate=(_first_shown_on_top(scores_G) + _first_shown_on_top(list(reordered_scores))) / 2,
        first_position_chance=1.0 / len(scores_G),
        self_consistency=kendall_tau_b(scores_G, aligned_G),
        independent_tau=kendall_tau_b(list(independent_G), scores_G) if varies and independent_G else None,
    )


def pair_audit_metrics(
    order_metrics: dict[str, float], scores_G: Sequence[float], independent_G: Sequence[float]
) -> dict[str, float]:
    """The audit of a group judged pair by pair in both orders (`agentrl.judges.pairwise`): its pairs' flip and
    first-position rates (chance 0.5), and Kendall's tau with the independent reward where that varies."""
    metrics = {"judge_audited": 1.0, **order_metrics, "judge_first_position_chance": 0.5}
    if len(set(independent_G)) > 1:
        metrics["judge_independent_tau"] = kendall_tau_b(list(independent_G), list(scores_G))
    return metrics


def debiased_scores(judgements: Sequence[tuple[Sequence[int], Sequence[float]]], size: int) -> list[float]:
    """The mean score of each trajectory over judgements in several orders ((order, scores as shown)),
    so no position's bias falls on one trajectory."""
    totals_G = [0.0] * size
    for order, scores in judgements:
        for shown, trajectory in enumerate(order):
            totals_G[trajectory] += scores[shown]
    return [total / len(judgements) for total in totals_G]
