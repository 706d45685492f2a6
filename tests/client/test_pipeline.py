"""Pipelined training on the real server and trainer: staleness bounds, turns that cross a swap, and
`max_steps_off_policy=0` as the synchronous loop."""

from __future__ import annotations

import asyncio

import pytest
import torch

import agentrl
from agentrl.client.pipeline import oldest_policy_step
from agentrl.foundation.openmp_spin import spin_is_bounded
from agentrl.records.tracking import load_trajectories

PROMPT = [{"role": "user", "content": "Name a fruit."}]


async def turn(model: agentrl.TrainableModel, messages: list) -> object:
    completion = await model.openai_client().chat.completions.create(
        model=model.inference_name, messages=messages, max_tokens=4, temperature=1.0
    )
    return completion.choices[0]


def policy_steps(trajectory: agentrl.Trajectory) -> list[int]:
    return [(c.model_extra or {})["policy_step"] for c in trajectory.choices()]


def trained_groups(model: agentrl.TrainableModel, step: int) -> list[agentrl.TrajectoryGroup]:
    return load_trajectories(model.run_dir / "trajectories" / f"train-{step:04d}.jsonl")


async def two_turns(model, reward: float, between=None) -> agentrl.Trajectory:
    trajectory = agentrl.Trajectory(messages_and_choices=[*PROMPT, await turn(model, PROMPT)], reward=reward)
    if between is not None:
        await between()
    trajectory.messages_and_choices = [*trajectory.messages_and_choices, {"role": "user", "content": "Another one."}]
    trajectory.messages_and_choices = [*trajectory.messages_and_choices, await turn(model, trajectory.messages())]
    return trajectory


async def test_off_policy_zero_is_the_synchronous_loop(served_model):
    start = await served_model.get_step()
    names: dict[int, set[str]] = {}

    def make_groups(model, step):
        async def rollout(reward):
            names.setdefault(step, set()).add(model.inference_name)
            return await two_turns(model, reward)

        return [agentrl.TrajectoryGroup(rollout(float(r)) for r in range(2)) for _ in range(2)]

    results = await agentrl.train_pipelined(
        served_model, make_groups, steps=2, max_steps_off_policy=0, config=agentrl.TrainConfig(learning_rate=1e-4)
    )
    assert [r.step for r in results] == [start + 1, start + 2]
    # Each step's rollouts sampled the adapter of the step before, as `gather, then train` does.
    assert names == {start: {f"test-agent@{start}"}, start + 1: {f"test-agent@{start + 1}"}}
    for result in results:
        assert result.metrics["staleness_max"] == 0 and result.metrics["num_groups_stale_dropped"] == 0
        # In turns: the trainer waits while rollouts run, and no rollout runs while it trains.
        assert 0.9 <= result.metrics["trainer_idle_frac"] + result.metrics["sampler_idle_frac"] <= 1.01, result.metrics
        groups = trained_groups(served_model, result.step)
        assert len(groups) == 2
        assert {s for g in groups for t in g.trajectories for s in policy_steps(t)} == {result.step - 1}


async def test_a_turn_after_a_swap_keeps_its_own_step_and_nothing_trains_too_stale(served_model, caplog):
    start = await served_model.get_step()
    first_step_done, crossing_done = asyncio.Event(), asyncio.Event()
    crossing_left = [4]

    async def crossing(model, reward):  # turn 1 at step `start`, turn 2 after the swap to `start + 1`
        trajectory = await two_turns(model, reward, first_step_done.wait)
        crossing_left[0] -= 1
        if not crossing_left[0]:
            crossing_done.set()
        return trajectory

    async def after_crossing(model, reward):  # so the crossing groups are the first to finish for step 2
        await crossing_done.wait()
        return await two_turns(model, reward)

    def make_groups(model, step):
        rollout = {start: two_turns, start + 1: crossing}.get(step, after_crossing)
        return [agentrl.TrajectoryGroup(rollout(model, float(r)) for r in range(2)) for _ in range(2)]

    trainer_thread = served_model.backend._trainer_thread
    threads_before = await trainer_thread.run(torch.get_num_threads)
    threads_while_training: list[int] = []

    async def after_step() -> None:
        first_step_done.set()
        threads_while_training.append(await trainer_thread.run(torch.get_num_threads))

    results = await agentrl.train_pipelined(
        served_model,
        make_groups,
        steps=3,
        max_steps_off_policy=1,
        config=agentrl.TrainConfig(learning_rate=1e-4, truncated_importance_sampling=2.0),
        on_step=lambda result: after_step(),
    )
    assert [r.step for r in results] == [start + 1, start + 2, start + 3]
    crossed = [policy_steps(t) for g in trained_groups(served_model, start + 2) for t in g.trajectories]
    assert crossed and all(steps == [start, start + 1] for steps in crossed), crossed
    assert results[1].metrics["staleness_max"] == 1  # trained at step start + 1 from a turn of step start
    for result in results:  # the bound, checked from every trained turn's recorded step
        for group in trained_groups(served_model, result.step):
            assert (result.step - 1) - oldest_policy_step(group, started_at=-1) <= 1
        assert 0 <= result.metrics["trainer_idle_frac"] <= 1 and 0 <= result.metrics["sampler_idle_frac"] <= 1
        assert result.metrics["steps_per_hour"] > 0
    lines = [m for m in agentrl.records.tracking.read_metrics(served_model.run_dir) if m.get("step") == start + 2]
    assert lines and lines[-1]["staleness_max"] == 1  # recorded in metrics.jsonl with the step
    # The suite's processes keep libgomp's own spin unless told otherwise: the CPU run is warned, naming the fix,
    # and its trainer computes on one thread while the run lasts, then on as many as before.
    assert ("GOMP_SPINCOUNT=2000" in caplog.text) is not spin_is_bounded()
    assert threads_while_training == [threads_before if spin_is_bounded() else 1] * 3
    assert await trainer_thread.run(torch.get_num_threads) == threads_before


async def test_groups_older_than_the_bound_are_dropped_and_counted(served_model):
    start = await served_model.get_step()
    release = asyncio.Event()

    def make_groups(model, step):
        if step == start:  # one slow group, sampled at step `start`, finishes only after two swaps
            slow = agentrl.TrajectoryGroup(two_turns(model, float(r), release.wait) for r in range(2))
            return [slow, agentrl.TrajectoryGroup(two_turns(model, float(r)) for r in range(2))]
        return [agentrl.TrajectoryGroup(two_turns(model, float(r)) for r in range(2))]

    steps_done = []

    def after(result):
        steps_done.append(result.step)
        if len(steps_done) == 2:
            release.set()

    results = await agentrl.train_pipelined(
        served_model,
        make_groups,
        steps=3,
        max_steps_off_policy=1,
        config=agentrl.TrainConfig(learning_rate=1e-4),
        on_step=after,
    )
    assert sum(r.metrics["num_groups_stale_dropped"] for r in results) >= 1
    # The backend was handed the stale groups: their sampled tokens are the ledger's stale row, and it closes.
    assert sum(r.metrics["tokens_discarded_stale"] for r in results) > 0
    for result in results:
        assert result.metrics["staleness_max"] <= 1
        assert result.metrics["tokens_unaccounted"] == 0


async def test_after_each_scores_every_group_before_it_trains(served_model):
    """A judge (here a stand-in that ranks by answer length) rescores each group as it finishes, in
    pipelined mode as in `gather_trajectory_groups`: groups whose own rewards are all equal train on
    the judge's rewards, and the trained trajectories carry them."""
    start = await served_model.get_step()
    judged: list[int] = []

    async def rank_by_length(group: agentrl.TrajectoryGroup) -> agentrl.TrajectoryGroup:
        judged.append(len(group.trajectories))
        lengths = [len(t.messages()[-1]["content"] or "") + i / 10 for i, t in enumerate(group.trajectories)]
        ranks = {length: rank for rank, length in enumerate(sorted(lengths))}
        scored = [t.model_copy(update={"reward": float(ranks[n])}) for t, n in zip(group.trajectories, lengths)]
        return group.model_copy(update={"trajectories": scored})

    def make_groups(model, step):  # every rollout's own reward is 0: without the judge, no signal
        return [agentrl.TrajectoryGroup(two_turns(model, 0.0) for _ in range(2)) for _ in range(2)]

    results = await agentrl.train_pipelined(
        served_model,
        make_groups,
        steps=2,
        max_steps_off_policy=1,
        config=agentrl.TrainConfig(learning_rate=1e-4),
        after_each=rank_by_length,
    )
    assert [r.step for r in results] == [start + 1, start + 2] and not any(r.skipped for r in results)
    assert judged == [2, 2, 2, 2]  # each of the two steps' two groups was judged once
    for result in results:
        rewards = sorted(t.reward for g in trained_groups(served_model, result.step) for t in g.trajectories)
        assert rewards == [0.0, 0.0, 1.0, 1.0]


async def test_the_exception_budget_is_the_loop_steps_not_each_groups(served_model):
    """`max_exception_rate` counts a step's rollouts together, as the synchronous loop's gather does: one failed
    rollout of a step's 6 at 20% is tolerated (kept in its group's exceptions) though its group of 3 alone
    would tolerate none; two are not, and the error names the loop step."""
    start = await served_model.get_step()

    async def broken(model):
        raise RuntimeError("the environment broke")

    def make_groups(failing: int, at_step: int):
        def groups(model, step):
            rollouts = [broken(model) if step == at_step and r < failing else two_turns(model, r % 3) for r in range(6)]
            return [agentrl.TrajectoryGroup(rollouts[:3]), agentrl.TrajectoryGroup(rollouts[3:])]

        return groups

    config = agentrl.TrainConfig(learning_rate=1e-4)
    results = await agentrl.train_pipelined(
        served_model, make_groups(1, start), steps=2, max_steps_off_policy=1, config=config, max_exception_rate=0.2
    )
    assert [r.step for r in results] == [start + 1, start + 2]
    trained = {r.step: sum(len(g.trajectories) for g in trained_groups(served_model, r.step)) for r in results}
    assert sorted(trained.values()) == [5, 6]  # the failed rollout's group trained on its other two
    recorded = {
        m["step"]: m for m in agentrl.records.tracking.read_metrics(served_model.run_dir) if m.get("step") in trained
    }
    assert sorted(m["exception_rate"] for m in recorded.values()) == [0.0, pytest.approx(1 / 6)]
    with pytest.raises(agentrl.RolloutError, match=f"2 of 6 rollouts of loop step {start + 2} failed"):
        await agentrl.train_pipelined(
            served_model,
            make_groups(2, start + 2),
            steps=1,
            max_steps_off_policy=1,
            config=config,
            max_exception_rate=0.2,
        )


def test_a_negative_bound_is_refused():
    with pytest.raises(agentrl.ConfigurationError, match="max_steps_off_policy must be an int >= 0"):
        asyncio.run(
            agentrl.train_pipelined(agentrl.TrainableModel(name="m"), lambda m, s: [], steps=1, max_steps_off_policy=-1)
        )


def test_a_groups_oldest_step_counts_an_unstamped_turn_as_the_rollouts_start():
    from agentrl.foundation.sampled_record import served_step

    def choice(**extra):
        return {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "x"}, **extra}

    stamped = agentrl.Trajectory(messages_and_choices=[*PROMPT, choice(policy_step=7), choice(policy_step=9)])
    unstamped = agentrl.Trajectory(messages_and_choices=[*PROMPT, choice()])  # a client dropped the field
    assert oldest_policy_step(agentrl.TrajectoryGroup([stamped]), started_at=8) == 7
    assert oldest_policy_step(agentrl.TrajectoryGroup([stamped, unstamped]), started_at=5) == 5
    assert oldest_policy_step(agentrl.TrajectoryGroup([]), started_at=3) == 3
    assert [served_step(n) for n in ("agent@12", "a@b@3", "base", "agent@", None)] == [12, 3, None, None, None]
