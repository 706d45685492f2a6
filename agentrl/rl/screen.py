"""Which of a step's groups can train, and why each of the others cannot. Pure, no I/O.

A step that trains nothing must say exactly why: "all rewards equal" is the wrong thing to tell a
user whose judge failed on every call or whose groups were never gathered. `screen_groups` sorts
the groups a step was given before any token is computed; the trainer adds the last two causes
(no reward variance, no token data) as it goes, and `skip_reason` words them all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agentrl.data.trajectory import check_reward, reward_stats
from agentrl.data.trajectory_group import TrajectoryGroup
from agentrl.foundation.errors import JudgeError

JUDGE_ERROR_TYPE = JudgeError.__name__


@dataclass(frozen=True)
class ScreenedGroups:
    """The groups that have trajectories to train on, and counts of those that do not."""

    trainable: list[TrajectoryGroup]
    num_given: int
    num_not_gathered: int  # built from awaitables that never ran
    num_all_failed: int  # every rollout raised (judge failures excluded)
    num_judge_failed: int  # dropped because the judge could not score them
    num_no_sampled_turns: int  # trajectories without one sampled Choice: nothing to train on
    last_judge_error: str | None

    def metrics(self) -> dict[str, float]:
        """Counts per cause, and the reward of the trainable groups (NaN when there are none)."""
        reward_mean, reward_std = reward_stats(r for g in self.trainable for r in g.rewards)
        return {
            "reward_mean": reward_mean,
            "reward_std": reward_std,
            "num_groups_given": float(self.num_given),
            "num_groups_not_gathered": float(self.num_not_gathered),
            "num_groups_all_rollouts_failed": float(self.num_all_failed),
            "num_groups_judge_failed": float(self.num_judge_failed),
            "num_groups_no_sampled_turns": float(self.num_no_sampled_turns),
        }


def _judge_error(group: TrajectoryGroup) -> str | None:
    messages = [e.message for e in group.exceptions if e.type == JUDGE_ERROR_TYPE]
    return messages[-1] if messages else None


def screen_groups(groups: Sequence[TrajectoryGroup]) -> ScreenedGroups:
    """Sort groups by whether they can train. Raises `RewardError` for a missing or non-finite reward."""
    trainable: list[TrajectoryGroup] = []
    not_gathered = all_failed = judge_failed = no_sampled_turns = 0
    last_judge_error = None
    for index, group in enumerate(groups):
        if group.pending:
            not_gathered += 1
            continue
        for member, trajectory in enumerate(group.trajectories):
            check_reward(trajectory, f"group {index}, trajectory {member}")
        if group.trajectories:
            if any(h.choices() for t in group.trajectories for h in t.histories()):
                trainable.append(group)
            else:
                no_sampled_turns += 1
        elif (error := _judge_error(group)) is not None:
            judge_failed += 1
            last_judge_error = error
        elif group.exceptions:
            all_failed += 1
        else:
            no_sampled_turns += 1  # an empty group: no trajectory at all
    return ScreenedGroups(
        trainable, len(groups), not_gathered, all_failed, judge_failed, no_sampled_turns, last_judge_error
    )


def judge_failure_error(screened: ScreenedGroups, max_rate: float) -> JudgeError | None:
    """A `JudgeError` when judge failures dropped all groups, or more than `max_rate` of them; else None."""
    failed, given = screened.num_judge_failed, screened.num_given
    if not failed or (failed < given and failed / given <= max_rate):
        return None
    return JudgeError(
        f"judge failures dropped {failed} of {given} groups this step (more than "
        f"TrainConfig.max_judge_failure_rate={max_rate}), so training stopped instead of learning from what is left. "
        f"Last judge error: {screened.last_judge_error}. Fix: check the judge model's name, its API key and base "
        "URL, and that it answers the JSON asked for (try one call by hand with agentrl.ruler); or raise "
        "max_judge_failure_rate to train on the groups that were judged"
    )


def skip_reason(screened: ScreenedGroups, *, num_zero_variance: int, num_skipped_trajectories: int) -> str:
    """Why a step trained nothing, cause by cause, with counts and the fix for each."""
    given = screened.num_given
    if given == 0:
        return "no groups were given (model.train was called with an empty list)"
    causes = []
    if screened.num_not_gathered:
        causes.append(
            f"{screened.num_not_gathered} of {given} groups were never gathered (their rollouts never ran): pass them "
            "through `await agentrl.gather_trajectory_groups(...)` first"
        )
    if screened.num_all_failed:
        causes.append(f"in {screened.num_all_failed} of {given} groups every rollout failed (see group.exceptions)")
    if screened.num_judge_failed:
        causes.append(
            f"{screened.num_judge_failed} of {given} groups were dropped because their judge failed "
            f"(last error: {screened.last_judge_error})"
        )
    if screened.num_no_sampled_turns:
        causes.append(
            f"{screened.num_no_sampled_turns} of {given} groups have no sampled assistant turn to train on (append the "
            "openai Choice of each completion to messages_and_choices, not a message dict)"
        )
    if num_zero_variance:
        causes.append(
            f"{num_zero_variance} of {given} groups had all rewards equal (no signal: vary the scenarios or the "
            "reward, or use more rollouts per group)"
        )
    if num_skipped_trajectories:
        causes.append(f"{num_skipped_trajectories} trajectories lacked sampled token data and were skipped")
    return "no group could train: " + "; ".join(causes or ["no trainable tokens"])
