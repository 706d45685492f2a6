"""The token ledger: every token the sampler generated for a step, trained or discarded for a named
reason. Pure, no I/O.

A step's ledger counts completion tokens (what the sampler generated, the only tokens that can carry
loss) and closes exactly: `tokens_sampled` = `tokens_trained` + the sum of the `tokens_discarded_*`
below, and `tokens_unaccounted` says by how much it does not (0 unless there is a bug). The reasons, in the order a token can be lost:

- `failed_rollout`: sampled by a rollout that then raised. The gateway tallies each rollout's tokens
  under the id `gather_trajectory_groups` gives it (`agentrl.foundation.rollout_id`: the header the backend's client sends);
  a failed rollout whose tally is unknown (sampled with a client that does not send the header) is
  counted in `ledger_failed_rollouts_unknown`, its tokens in no row.
- `judge_failure`: in a group RULER could not score (dropped whole), or a rollout whose rubric judge
  raised.
- `stale`: in a group its caller sampled and then dropped (`model.train(dropped=...)`): `train_pipelined`'s
  groups further off-policy than its bound.
- `zero_variance`: in a group whose rewards were all equal (no advantage, no gradient).
- `no_token_data`: in a trajectory skipped for lacking its sampled token ids
  (`TrainConfig.allow_training_without_logprobs`).
- `masked`: left out of the loss by a mismatch mask (`mismatch_token_mask` / `mismatch_sequence_mask`).

Truncated turns (`finish_reason == "length"`) are trained, as in ART and TRL; the ledger does not
discard them. A turn a rollout sampled but did not put in its trajectory is not visible to the trainer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from openai.types.chat.chat_completion import Choice

from agentrl.data.trajectory import Trajectory
from agentrl.data.trajectory_group import TrajectoryGroup
from agentrl.foundation.errors import JudgeError
from agentrl.foundation.sampled_record import SampledRecord

logger = logging.getLogger(__name__)

REASONS = ("failed_rollout", "judge_failure", "stale", "zero_variance", "no_token_data", "masked")
"""Why a sampled token was not trained; each is the metric `tokens_discarded_<reason>`."""


@dataclass(frozen=True)
class StepCounts:
    """What a GRPO step's trainer counted in the groups it was given, as integers: what it could not train
    (read by the skip reason) and where each of their sampled tokens went (read by the ledger)."""

    zero_variance_groups: int = 0
    """Groups whose rewards were all equal: no advantage, nothing to learn."""
    skipped_trajectories: int = 0
    """Trajectories left out for lacking their sampled token data."""
    tokens_trained: int = 0
    """Sampled tokens that carried loss (the loss mask less the mismatch mask)."""
    tokens_zero_variance: int = 0
    tokens_no_token_data: int = 0
    tokens_masked: int = 0


def choice_tokens(choice: Choice) -> int:
    """Completion tokens a sampled turn carries: its `token_ids`, else its logprob entries."""
    token_ids = SampledRecord.of(choice).token_ids
    if token_ids is not None:
        return len(token_ids)
    content = choice.logprobs.content if choice.logprobs is not None else None
    return len(content or [])


def trajectory_tokens(trajectory: Trajectory) -> int:
    """Completion tokens of every sampled turn of a trajectory, all its conversations."""
    return sum(choice_tokens(c) for history in trajectory.histories() for c in history.choices())


def group_tokens(groups: Iterable[TrajectoryGroup]) -> int:
    """Completion tokens of every trajectory of these groups."""
    return sum(trajectory_tokens(t) for group in groups for t in group.trajectories)


def failure_tokens(
    groups: Iterable[TrajectoryGroup], rollout_tokens: Callable[[str], int | None]
) -> tuple[dict[str, int], int]:
    """Tokens the groups' failures discarded, as `failed_rollout` and `judge_failure`, and how many failures
    are of unknown size. A rollout that raised (a rubric judge's `JudgeError` counts as a judge failure)
    is sized by the gateway's tally under its rollout id; a group RULER could not score, by the tokens it
    dropped (`RolloutException.sampled_tokens`)."""
    discarded, unknown = {"failed_rollout": 0, "judge_failure": 0}, 0
    for exception in (e for group in groups for e in group.exceptions):
        reason = "judge_failure" if exception.type == JudgeError.__name__ else "failed_rollout"
        tokens = exception.sampled_tokens
        if tokens is None and exception.rollout_id is not None:
            tokens = rollout_tokens(exception.rollout_id)
        if tokens is None:
            unknown += 1
        else:
            discarded[reason] += tokens
    return discarded, unknown


def close_ledger(
    sampled: int, trained: int, discarded: dict[str, int], *, failed_rollouts_unknown: int
) -> dict[str, float]:
    """The ledger's metrics. `sampled` is counted from the step's groups and the gateway's tallies,
    `trained` from the trainer's loss mask: two independent counts, so `tokens_unaccounted` (sampled
    less trained less every discard) is 0 when every token is accounted for, and anything else is a
    bug to report. Every reason is named, zeros included, so a plotted series never goes missing."""
    unknown = sorted(set(discarded) - set(REASONS))
    if unknown:
        raise ValueError(f"unknown discard reasons {unknown}; the reasons are {REASONS}")
    rows = {f"tokens_discarded_{reason}": float(discarded.get(reason, 0)) for reason in REASONS}
    return {
        "tokens_sampled": float(sampled),
        "tokens_trained": float(trained),
        **rows,
        "tokens_unaccounted": float(sampled - trained - sum(discarded.values())),
        "ledger_failed_rollouts_unknown": float(failed_rollouts_unknown),
    }


def step_ledger(
    groups: list[TrajectoryGroup],
    dropped: Iterable[TrajectoryGroup],
    counts: StepCounts,
    rollout_tokens: Callable[[str], int | None],
) -> dict[str, float]:
    """The ledger of a step given `groups`: the trainer's rows from its `counts`, the stale row from the groups
    its caller sampled and `dropped`, failed rollouts from the gateway's tallies (`rollout_tokens`)."""
    failures, unknown = failure_tokens(groups, rollout_tokens)
    discarded = {
        **failures,
        "stale": group_tokens(dropped),
        "zero_variance": counts.tokens_zero_variance,
        "no_token_data": counts.tokens_no_token_data,
        "masked": counts.tokens_masked,
    }
    sampled = group_tokens(groups) + sum(failures.values()) + discarded["stale"]
    ledger = close_ledger(sampled, counts.tokens_trained, discarded, failed_rollouts_unknown=unknown)
    if ledger["tokens_unaccounted"]:
        logger.warning("the token ledger does not close: %s (please report this)", ledger)
    return ledger
