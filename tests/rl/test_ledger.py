"""The token ledger's parts without a server: the gateway's per-rollout tally, the rollout id a gather
gives each rollout, the rows a step's groups and its trainer's metrics make, and `agentrl show`'s line.
The ledger closing on a real step: tests/behaviour/test_closed_loop.py."""

import logging

import pytest

import agentrl
from agentrl.cli.runs import ledger_line
from agentrl.foundation.rollout_id import current_rollout
from agentrl.gateway.store import SampledChoice, SampledStore
from agentrl.rl.ledger import REASONS, StepCounts, close_ledger, step_ledger
from tests.helpers import make_choice


def answered(*token_counts: int, reward: float = 0.0) -> agentrl.Trajectory:
    """A trajectory of one sampled turn per count (ids 1..n), each after a user message."""
    items: list = []
    for n in token_counts:
        items += [{"role": "user", "content": "q"}, make_choice(list(range(1, n + 1)))]
    return agentrl.Trajectory(messages_and_choices=items, reward=reward)


def sampled(n: int) -> SampledChoice:
    return SampledChoice(prompt_token_ids=[7, 8], token_ids=list(range(n)), logprobs=[-1.0] * n, policy_step=0)


def test_the_gateway_tallies_each_rollouts_tokens_and_forgets_the_oldest_beyond_its_bound():
    store = SampledStore(max_completions=2)
    store.put("c1", [sampled(3)], "r1")
    store.put("c2", [sampled(4), sampled(2)], "r1")  # n=2: both choices count
    store.put("c3", [sampled(5)])  # no rollout named: kept for lookup, tallied nowhere
    assert store.rollout_tokens("r1") == 9 and store.rollout_tokens("r2") is None
    store.put("c4", [sampled(1)], "r2")
    store.put("c5", [sampled(1)], "r3")  # a third rollout: r1, the oldest, is forgotten
    assert store.rollout_tokens("r1") is None and store.rollout_tokens("r3") == 1


async def test_a_gather_gives_each_rollout_an_id_its_requests_see_and_a_failure_keeps():
    seen: list[str | None] = []

    async def ok() -> agentrl.Trajectory:
        seen.append(current_rollout.get())
        return answered(2)

    async def broken() -> agentrl.Trajectory:
        seen.append(current_rollout.get())
        raise RuntimeError("the environment broke after sampling")

    (group,) = await agentrl.gather_trajectory_groups(
        [agentrl.TrajectoryGroup([ok(), broken(), ok()])], max_exceptions=1, show_progress=False
    )
    assert len(seen) == 3 and all(seen) and len(set(seen)) == 3  # one id per rollout
    assert group.exceptions[0].rollout_id in seen and current_rollout.get() is None  # the caller's context untouched


def test_a_steps_ledger_closes_with_every_reason_counted():
    failed = RuntimeError("boom")
    judged_out = agentrl.JudgeError("judge down")
    groups = [
        agentrl.TrajectoryGroup(
            [answered(3, 2), answered(4, reward=1.0)],  # 9 tokens
            exceptions=[
                agentrl.RolloutException.from_exception(failed, rollout_id="r-known"),
                agentrl.RolloutException.from_exception(failed, rollout_id="r-gone"),
                agentrl.RolloutException.from_exception(failed),  # sampled by another client: no id
                agentrl.RolloutException.from_exception(judged_out, rollout_id="r-rubric"),  # its rubric judge raised
            ],
        ),
        agentrl.TrajectoryGroup([answered(5), answered(6)]),  # 11 tokens, all rewards equal
        agentrl.TrajectoryGroup([], exceptions=[agentrl.RolloutException.from_exception(judged_out, sampled_tokens=7)]),
    ]
    stale = agentrl.TrajectoryGroup([answered(6, 7)])  # sampled, then dropped by its caller: 13 tokens
    trainer = StepCounts(tokens_zero_variance=11, tokens_masked=2, tokens_trained=7)
    tallies = {"r-known": 4, "r-rubric": 3}
    ledger = step_ledger(groups, [stale], trainer, tallies.get)
    assert ledger["tokens_sampled"] == 9 + 11 + 4 + (7 + 3) + 13
    assert ledger["tokens_discarded_failed_rollout"] == 4 and ledger["tokens_discarded_judge_failure"] == 7 + 3
    assert ledger["ledger_failed_rollouts_unknown"] == 2  # "r-gone" and the one without an id
    assert ledger["tokens_unaccounted"] == 0
    assert ledger["tokens_sampled"] == ledger["tokens_trained"] + sum(ledger[f"tokens_discarded_{r}"] for r in REASONS)


def test_a_ledger_that_does_not_close_says_by_how_much_and_warns(caplog):
    groups = [agentrl.TrajectoryGroup([answered(3), answered(4, reward=1.0)])]
    with caplog.at_level(logging.WARNING, logger="agentrl.rl.ledger"):
        ledger = step_ledger(
            groups, [], StepCounts(tokens_trained=6), lambda _: None
        )  # one of the 7 tokens went missing
    assert ledger["tokens_unaccounted"] == 1 and "does not close" in caplog.text
    with pytest.raises(ValueError, match="unknown discard reasons"):
        close_ledger(1, 0, {"lost": 1}, failed_rollouts_unknown=0)


def test_agentrl_show_sums_the_ledger_over_steps():
    steps = [
        close_ledger(10, 6, {"zero_variance": 4}, failed_rollouts_unknown=0),
        close_ledger(8, 5, {"masked": 1, "failed_rollout": 2}, failed_rollouts_unknown=0),
    ]
    line = ledger_line(steps)
    assert line.startswith("token ledger, 2 steps: 18 sampled = 11 trained + 2 failed rollout + 0 judge failure")
    assert "4 zero variance" in line and "1 masked" in line and line.endswith("(unaccounted: 0)")
