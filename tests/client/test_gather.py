"""gather.py: concurrency, the exception budget, after_each, and order."""

import asyncio

import pytest

from agentrl import (
    ExceptionBudget,
    RolloutError,
    Trajectory,
    TrajectoryGroup,
    gather_trajectories,
    gather_trajectory_groups,
)
from agentrl.client.gather import gather_counted


async def rollout(reward: float, *, fail: bool = False, delay: float = 0.0) -> Trajectory:
    await asyncio.sleep(delay)
    if fail:
        raise RuntimeError(f"rollout {reward} broke")
    return Trajectory(reward=reward)


async def test_groups_come_back_resolved_and_in_order():
    groups = [TrajectoryGroup(rollout(g + i / 10, delay=0.05 * (3 - g)) for i in range(3)) for g in range(3)]
    resolved = await gather_trajectory_groups(groups, show_progress=False)
    assert [g.rewards for g in resolved] == [[0.0, 0.1, 0.2], [1.0, 1.1, 1.2], [2.0, 2.1, 2.2]]


async def test_rollouts_run_concurrently():
    loop = asyncio.get_running_loop()
    start = loop.time()
    await gather_trajectory_groups([TrajectoryGroup(rollout(0, delay=0.3) for _ in range(10))], show_progress=False)
    assert loop.time() - start < 1.5  # 10 x 0.3 s sequentially would be 3 s


async def test_by_default_one_failure_raises_and_names_the_fix():
    groups = [TrajectoryGroup([rollout(1), rollout(0, fail=True)])]
    with pytest.raises(RolloutError, match="max_exceptions") as info:
        await gather_trajectory_groups(groups, show_progress=False)
    assert isinstance(info.value.__cause__, RuntimeError)


async def test_failures_within_the_count_budget_are_kept_in_the_group():
    groups = [TrajectoryGroup([rollout(1), rollout(0, fail=True), rollout(0.5)])]
    (group,) = await gather_trajectory_groups(groups, max_exceptions=1, show_progress=False)
    assert group.rewards == [1, 0.5]
    assert [e.type for e in group.exceptions] == ["RuntimeError"]
    assert "rollout 0 broke" in group.exceptions[0].traceback


async def test_gathers_sharing_a_tally_count_their_failures_together():
    """A pipelined step gathers each group on its own against the step's one tally: 1 failure in 6 at 20%
    is within it (alone, a group of 3 at 20% would tolerate none), a second one is not."""
    tally = ExceptionBudget(max_exception_rate=0.2).tally(6, of="rollouts of loop step 0")
    first = await gather_counted(
        [TrajectoryGroup([rollout(1), rollout(0, fail=True), rollout(2)])], tally, show_progress=False
    )
    assert first[0].rewards == [1, 2] and len(first[0].exceptions) == 1
    with pytest.raises(RolloutError, match="2 of 6 rollouts of loop step 0 failed, more than the 1 allowed"):
        await gather_counted(
            [TrajectoryGroup([rollout(1), rollout(0, fail=True), rollout(2)])], tally, show_progress=False
        )
    with pytest.raises(RolloutError, match="1 of 3 rollouts failed, more than the 0 allowed"):
        await gather_trajectory_groups(
            [TrajectoryGroup([rollout(1), rollout(0, fail=True), rollout(2)])],
            max_exception_rate=0.2,
            show_progress=False,
        )


async def test_rate_budget_counts_against_all_rollouts():
    ok = [TrajectoryGroup([rollout(1), rollout(0, fail=True)]) for _ in range(5)]  # 5 of 10 fail
    resolved = await gather_trajectory_groups(ok, max_exception_rate=0.5, show_progress=False)
    assert sum(len(g.exceptions) for g in resolved) == 5
    too_many = [TrajectoryGroup([rollout(1), rollout(0, fail=True)]) for _ in range(5)]
    with pytest.raises(RolloutError, match="5 of 10|of 10 rollouts failed"):
        await gather_trajectory_groups(too_many, max_exception_rate=0.4, show_progress=False)


def test_budget_takes_the_tighter_limit_and_rejects_nonsense():
    assert ExceptionBudget(max_exceptions=3, max_exception_rate=0.1).allowed(100) == 3
    assert ExceptionBudget(max_exceptions=30, max_exception_rate=0.1).allowed(100) == 10
    assert ExceptionBudget().allowed(100) == 0
    with pytest.raises(ValueError, match="fraction"):
        ExceptionBudget(max_exception_rate=2)
    with pytest.raises(ValueError, match="count"):
        ExceptionBudget(max_exceptions=-1)


async def test_after_each_can_replace_or_drop_groups():
    async def judge(group: TrajectoryGroup) -> TrajectoryGroup | None:
        if max(group.rewards) < 1:
            return None
        return group.model_copy(
            update={"trajectories": [t.model_copy(update={"reward": 9.0}) for t in group.trajectories]}
        )

    groups = [TrajectoryGroup([rollout(1), rollout(0)]), TrajectoryGroup([rollout(0), rollout(0)])]
    kept = await gather_trajectory_groups(groups, after_each=judge, show_progress=False)
    assert [g.rewards for g in kept] == [[9.0, 9.0]]


async def test_a_rollout_that_returns_the_wrong_type_counts_as_a_failure():
    async def bad() -> str:
        return "not a trajectory"

    with pytest.raises(RolloutError, match="must return an agentrl.Trajectory"):
        await gather_trajectory_groups([TrajectoryGroup([bad()])], show_progress=False)


async def test_gather_trajectories_without_groups():
    trajectories = await gather_trajectories((rollout(r) for r in (0.2, 0.4)), show_progress=False)
    assert [t.reward for t in trajectories] == [0.2, 0.4]


async def test_the_bar_shows_the_running_mean_of_every_metric(capsys):
    async def measured(turns: float) -> Trajectory:
        return Trajectory(reward=turns / 10, metrics={"turns": turns})

    await gather_trajectory_groups([TrajectoryGroup(measured(t) for t in (1.0, 2.0, 3.0))], desc="demo")
    shown = capsys.readouterr().err
    assert "turns=2" in shown and "reward=0.200" in shown and "exceptions=0" in shown


async def test_a_gathered_group_keeps_its_metadata_metrics_and_logs():
    group = TrajectoryGroup([rollout(1.0), rollout(0.0)], metadata={"scenario": 3}, metrics={"cost": 0.5}, logs=["x"])
    (gathered,) = await gather_trajectory_groups([group], show_progress=False)
    assert (gathered.metadata, gathered.metrics, gathered.logs) == ({"scenario": 3}, {"cost": 0.5}, ["x"])
    assert sorted(gathered.rewards) == [0.0, 1.0] and not gathered.pending
