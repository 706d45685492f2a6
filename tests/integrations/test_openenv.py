"""OpenEnv environments (written with OpenEnv's server API, served by uvicorn on loopback) train on agentrl.

Fast tier: the adapter's errors. Slow tier: a text environment and an MCP-tools environment each
play episodes with the packaged model on the shared vLLM server and train a step.
"""

from __future__ import annotations

import asyncio

import pytest

import agentrl
from agentrl.backend.processes import free_port
from agentrl.integrations.openenv import default_observation_text, openenv_rollout, serve_openenv
from tests.helpers import assert_trains_on_exact_tokens, children


async def test_an_unreachable_environment_and_an_app_that_cannot_start_are_clear_errors():
    model = agentrl.Model(name="m", base_url="http://127.0.0.1:9/v1", api_key="k")
    with pytest.raises(agentrl.ServerError, match="could not connect to the OpenEnv environment"):
        await openenv_rollout(model, f"http://127.0.0.1:{free_port()}")
    before = children()
    with pytest.raises(agentrl.ServerError, match="exited"):
        async with serve_openenv("tests.no_such_module:app", startup_timeout_s=60):
            pass
    await asyncio.sleep(0.3)
    assert children() <= before


async def test_a_full_environment_says_so_and_an_episode_ends_without_a_server_traceback(capfd):
    from agentrl.integrations.openenv import _TextEnvClient

    model = agentrl.Model(name="m", base_url="http://127.0.0.1:9/v1", api_key="k")
    async with serve_openenv("tests.openenv_envs:single_app") as url:
        playing = _TextEnvClient(base_url=url)  # the one session the server takes
        await playing.connect()
        await playing.reset()
        with pytest.raises(agentrl.ServerError, match=r"is at capacity \(Server at capacity: 1/1.*max_concurrent_envs"):
            await openenv_rollout(model, url)
        await playing.step({"message": "9"})
        await playing.close()
        again = _TextEnvClient(base_url=url)  # the session was ended on the server: a new one is taken
        await again.connect()
        await again.reset()
        await again.close()
        await asyncio.sleep(0.5)
    server_log = capfd.readouterr().err
    assert "Traceback" not in server_log and "WebSocketDisconnect" not in server_log, server_log[-3000:]


def test_observations_become_text_the_model_reads():
    assert default_observation_text({"prompt": "Say hi", "done": False}) == "Say hi"
    assert default_observation_text({"board": [1, 2], "reward": 0.0, "metadata": {}}) == '{"board": [1, 2]}'


@pytest.mark.slow
async def test_a_text_openenv_environment_trains_a_step(served_model):
    async with serve_openenv("tests.openenv_envs:number_app") as url:
        trajectories = await agentrl.gather_trajectories(
            (openenv_rollout(served_model, url, max_turns=2, max_tokens=16) for _ in range(4)), show_progress=False
        )
    for trajectory in trajectories:
        assert trajectory.messages()[0]["content"] == "Reply with one number larger than 7."
        assert trajectory.reward in (0.0, 1.0) and 1 <= trajectory.metrics["env_steps"] <= 2
        assert trajectory.metrics["turns"] == trajectory.metrics["env_steps"]
    if len({t.reward for t in trajectories}) == 1:  # the environment gave every episode the same reward
        trajectories[0].reward += 0.5  # so the step has a gradient to train; the rewards above are the env's
    await assert_trains_on_exact_tokens(served_model, trajectories)


@pytest.mark.slow
async def test_an_openenv_environment_with_mcp_tools_trains_a_step(served_model):
    async with serve_openenv("tests.openenv_envs:tools_app") as url:
        trajectories = await agentrl.gather_trajectories(
            (openenv_rollout(served_model, url, use_tools=True, max_turns=3, max_tokens=48) for _ in range(3)),
            show_progress=False,
        )
    for trajectory in trajectories:
        assert trajectory.messages()[0]["content"].startswith("What is 2 + 3?")
        assert {t["function"]["name"] for t in trajectory.tools} == {"add", "submit"}
        assert trajectory.reward in (0.0, 1.0)
    for index, trajectory in enumerate(trajectories):
        trajectory.reward += index  # distinct rewards: the step trains whatever the small model did
    await assert_trains_on_exact_tokens(served_model, trajectories)
