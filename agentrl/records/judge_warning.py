"""A step's judge audit read back from its metrics: the warning a run's log gives when its judge looks no better
than chance (`agentrl.judges.audit` measures; this reads what it measured, as any record of a step can)."""

from __future__ import annotations

from typing import Any

from agentrl.records.step_metrics import GROUP_PREFIX

CHANCE_FLIP_RATE = 0.4
"""A step whose audited flip rate reaches this is warned about: the judge's order is mostly noise."""

JUDGE_KEYS = ("judge_", "ruler_")
"""How a judge figure's name starts."""


def judge_figures(line: dict[str, Any]) -> dict[str, Any]:
    """A step line's judge figures ("judge_*", "ruler_*") by their own names, wherever the judge put them: on
    each group (RULER judges a group at once: "group/judge_flip_rate") or on each trajectory (the rubric judge
    judges one at a time); a group's figure wins where a step holds both."""
    own = {k: v for k, v in line.items() if k.startswith(JUDGE_KEYS)}
    grouped = {k.removeprefix(GROUP_PREFIX): v for k, v in line.items() if k.startswith(GROUP_PREFIX)}
    return {**own, **{k: v for k, v in grouped.items() if k.startswith(JUDGE_KEYS)}}


def audit_warning(line: dict[str, float]) -> str | None:
    """What is wrong with the judge, from a step line's averaged audit metrics, or None when nothing shows."""
    metrics = judge_figures(line)
    if "judge_audited" not in metrics:
        return None
    problems = []
    if metrics.get("judge_flip_rate", 0.0) >= CHANCE_FLIP_RATE:
        problems.append(f"it reorders {metrics['judge_flip_rate']:.0%} of pairs when the order of presentation changes")
    chance = metrics.get("judge_first_position_chance", 0.0)
    if metrics.get("judge_first_position_rate", 0.0) >= max(0.5, 2 * chance):
        problems.append(
            f"the attempt shown first wins {metrics['judge_first_position_rate']:.0%} of judgements (chance {chance:.0%})"
        )
    if metrics.get("judge_independent_tau", 1.0) <= 0.0:
        problems.append(f"its order disagrees with the independent reward (tau {metrics['judge_independent_tau']:.2f})")
    if not problems:
        return None
    return (
        "the judge looks no better than chance: "
        + "; ".join(problems)
        + ". Check it with `agentrl judge check`, use a stronger judge, or debias it (ruler_score_group(permutations=k))"
    )
