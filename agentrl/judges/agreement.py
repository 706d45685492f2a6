"""Pure statistics for judge checks: how well a judge's scores order a group, against a known reward.

All functions take plain lists: `reference_G` (the verifiable reward of each group member) and
`scores_G` (the judge's scores, same order). Within a group only the order matters to GRPO, so
agreement is measured on pairs: a pair the reference orders strictly is concordant when the judge
orders it the same way (a judge tie counts half), which makes 0.5 the level of a judge that guesses.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import combinations


@dataclass(frozen=True)
class PairCounts:
    """Concordance credit over the pairs of one group that the reference orders strictly."""

    credit: float
    pairs: int


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def pair_counts(reference_G: Sequence[float], scores_G: Sequence[float]) -> PairCounts:
    """Pairs the reference orders strictly, and how many of them the judge orders the same way."""
    credit, pairs = 0.0, 0
    for i, j in combinations(range(len(reference_G)), 2):
        truth = _sign(reference_G[i] - reference_G[j])
        if truth == 0:
            continue
        pairs += 1
        judged = _sign(scores_G[i] - scores_G[j])
        credit += 1.0 if judged == truth else 0.5 if judged == 0 else 0.0
    return PairCounts(credit, pairs)


def kendall_tau_b(reference_G: Sequence[float], scores_G: Sequence[float]) -> float:
    """Kendall's tau-b (ties corrected); 0 when either side is constant (no order to agree with)."""
    concordant = discordant = tied_reference = tied_scores = 0
    for i, j in combinations(range(len(reference_G)), 2):
        a, b = _sign(reference_G[i] - reference_G[j]), _sign(scores_G[i] - scores_G[j])
        tied_reference += a == 0
        tied_scores += b == 0
        if a and b:
            concordant += a == b
            discordant += a != b
    total = len(reference_G) * (len(reference_G) - 1) // 2
    denominator = math.sqrt((total - tied_reference) * (total - tied_scores))
    return (concordant - discordant) / denominator if denominator else 0.0


def rank_flip_rate(scores_a_G: Sequence[float], scores_b_G: Sequence[float]) -> float:
    """The fraction of pairs whose order (or tie) differs between two scorings of the same group."""
    pairs = list(combinations(range(len(scores_a_G)), 2))
    if not pairs:
        return 0.0
    flips = sum(_sign(scores_a_G[i] - scores_a_G[j]) != _sign(scores_b_G[i] - scores_b_G[j]) for i, j in pairs)
    return flips / len(pairs)


@dataclass(frozen=True)
class Estimate:
    """A statistic over groups with a 95% bootstrap interval (resampling groups)."""

    value: float
    low: float
    high: float
    n: int
    """What it is computed over (pairs for accuracy, groups for tau)."""


def bootstrap(
    items: Sequence[object],
    statistic: Callable[[Sequence[object]], float],
    *,
    n: int,
    resamples: int = 2000,
    seed: int = 0,
) -> Estimate:
    """`statistic(items)` with the 2.5 and 97.5 percentiles of it over resamples of `items`."""
    if not items:
        return Estimate(math.nan, math.nan, math.nan, 0)
    rng = random.Random(seed)
    draws = sorted(statistic(rng.choices(items, k=len(items))) for _ in range(resamples))
    return Estimate(statistic(items), draws[int(0.025 * resamples)], draws[int(0.975 * resamples) - 1], n)


def pairwise_accuracy(counts: Sequence[PairCounts]) -> Estimate:
    """Concordant pairs over all strictly ordered pairs, pooled over groups, with a group bootstrap."""

    def pooled(sample: Sequence[object]) -> float:
        chosen = [c for c in sample if isinstance(c, PairCounts)]
        pairs = sum(c.pairs for c in chosen)
        return sum(c.credit for c in chosen) / pairs if pairs else math.nan

    informative = [c for c in counts if c.pairs]
    return bootstrap(informative, pooled, n=sum(c.pairs for c in informative))


def mean_with_interval(values: Sequence[float]) -> Estimate:
    """The mean of per-group values (e.g. tau) with a bootstrap interval."""

    def mean(sample: Sequence[object]) -> float:
        return sum(float(v) for v in sample if isinstance(v, (int, float))) / len(sample)

    return bootstrap(list(values), mean, n=len(values))
