"""The tool-use agent written with the OpenAI Agents SDK and with LangGraph, each run as its own program through
a rollout session (agentrl_environments.tool_use.frameworks): recorded turn by turn, scored by the task, and
trained one step on the engine's exact tokens."""

from __future__ import annotations

import asyncio

import pytest

from agentrl_environments.tool_use.env import SYSTEM_PROMPT
from agentrl_environments.tool_use.frameworks import PROGRAMS, program_rollout
from agentrl_environments.tool_use.task import questions
from tests.helpers import assert_trains_on_exact_tokens


@pytest.mark.parametrize("agent", sorted(PROGRAMS))
async def test_a_framework_agent_in_its_own_process_is_scored_and_trains_one_step(served_model, agent):
    pytest.importorskip("agents" if agent == "openai-agents" else "langgraph")
    question = questions("test", 3)[2]
    trajectories = await asyncio.gather(*(program_rollout(served_model, question, agent=agent) for _ in range(2)))
    for trajectory in trajectories:
        messages = trajectory.messages()
        assert messages[:2] == [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": question.question},
        ], "the program's own conversation, as its framework sent it"
        assert trajectory.choices() and {t["function"]["name"] for t in trajectory.tools or []} == {
            "add", "multiply", "lookup_price", "convert_units"}  # fmt: skip
        assert trajectory.metadata["question_id"] == question.question_id
        assert trajectory.metrics["turns"] >= 1 and 0.0 <= trajectory.reward <= 1.0
    # The task's reward rarely differs between two base-model attempts; one step needs a difference.
    trajectories[0].reward, trajectories[1].reward = 0.0, 1.0
    await assert_trains_on_exact_tokens(served_model, list(trajectories))
