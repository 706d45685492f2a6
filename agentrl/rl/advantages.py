"""Group-relative advantages (GRPO). Pure Python, no I/O.

`_P` indexes groups (problems), `_G` the members of one group.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from agentrl.rl.sequence_weights import conversation_weights

if TYPE_CHECKING:
    from agentrl.rl.tokenize import TokenizedSequence


def group_advantages(rewards_G: Sequence[float], *, scale_by_std: bool, eps: float = 1e-6) -> list[float]:
    """`r - mean(r)` for each member, divided by the group's std when `scale_by_std` (GRPO).

    The std is the population std; `eps` keeps a near-constant group from exploding. Without the
    division (Dr. GRPO) easy and hard scenarios are not re-weighted by their reward spread.
    """
    if not rewards_G:
        return []
    mean = sum(rewards_G) / len(rewards_G)
    centred_G = [r - mean for r in rewards_G]
    if not scale_by_std:
        return centred_G
    std = math.sqrt(sum(c * c for c in centred_G) / len(centred_G))
    return [c / (std + eps) for c in centred_G]


@dataclass(frozen=True)
class GroupAdvantages:
    """Advantages for the groups that carry a learning signal."""

    advantages_P_G: list[list[float]]
    """One list per kept group, aligned with that group's trajectories."""
    kept_group_indices: list[int]
    """Index (into the input) of each kept group."""
    num_dropped_groups: int
    """Groups dropped because all their rewards were equal (or they had under two members)."""


def balanced(advantages_G: list[float], balance: float) -> list[float]:
    """ART's `advantage_balance`: negative advantages times (1 - balance) when it is above 0, positive ones times
    (1 + balance) when below."""
    if balance > 0:
        return [a if a > 0 else a * (1 - balance) for a in advantages_G]
    if balance < 0:
        return [a if a < 0 else a * (1 + balance) for a in advantages_G]
    return advantages_G


def compute_group_advantages(
    rewards_P_G: Sequence[Sequence[float]], *, scale_by_std: bool, balance: float = 0.0, atol: float = 1e-9
) -> GroupAdvantages:
    """Advantages for each group (`balance`: see `balanced`); groups whose rewards are all equal carry no signal
    and are dropped."""
    advantages_P_G: list[list[float]] = []
    kept: list[int] = []
    for index, rewards_G in enumerate(rewards_P_G):
        if len(rewards_G) < 2 or max(rewards_G) - min(rewards_G) <= atol:
            continue
        advantages_P_G.append(balanced(group_advantages(rewards_G, scale_by_std=scale_by_std), balance))
        kept.append(index)
    return GroupAdvantages(advantages_P_G, kept, num_dropped_groups=len(rewards_P_G) - len(kept))


def scaled_by_mean_abs(
    sequences: list[TokenizedSequence], *, enabled: bool, per: Literal["token", "conversation"] = "token"
) -> list[TokenizedSequence]:
    """ART's packing, where `enabled` (`TrainConfig.scale_advantages_by_mean_abs`): every sequence's advantage
    divided by the mean |advantage| over the step's loss tokens (`per="token"`), or over its conversations, each
    weighing alike (`per="conversation"`: ART's LocalBackend, which weights each trajectory's tokens by 1/its
    length), so a step moves the adapter as far whatever the spread of its rewards."""
    if not enabled:
        return sequences
    if per == "token":
        weights_S = [float(sum(s.loss_mask_T[1:])) for s in sequences]
    else:
        weights_S = conversation_weights(sequences)
    weighted = sum(abs(s.advantage) * w for s, w in zip(sequences, weights_S, strict=True))
    if weighted == 0:
        return sequences
    mean_abs = weighted / sum(weights_S)
    return [dataclasses.replace(s, advantage=s.advantage / mean_abs) for s in sequences]
