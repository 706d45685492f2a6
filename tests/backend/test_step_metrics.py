"""A step's metrics are built once: the trajectories of a train step, or of an evaluation, summarised one time
(real server, the session's model)."""

from __future__ import annotations

import pytest

import agentrl
from tests.helpers import alternating_reward_groups

pytestmark = pytest.mark.slow


async def test_a_step_and_an_evaluation_each_summarise_their_trajectories_once(served_model, monkeypatch):
    from agentrl.records import step_metrics as tracking

    summarised: list[int] = []
    real = tracking.summarize

    def counted(trajectories):
        summarised.append(len(trajectories))
        return real(trajectories)

    monkeypatch.setattr(tracking, "summarize", counted)
    groups = await alternating_reward_groups(served_model)
    summarised.clear()
    result = await served_model.train(groups, agentrl.TrainConfig(learning_rate=1e-5))
    assert summarised == [sum(len(g) for g in groups)] and "reward_mean" in result.metrics
    await served_model.log(groups, "val")
    assert len(summarised) == 2
