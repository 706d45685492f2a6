"""Two OpenEnv environments written with OpenEnv's own server API, served by uvicorn in the tests.

`number_app`: reset asks for a number above 7; each step reads the model's message, rewards 1.0 for
a number above 7 (else 0.0), and ends after two steps or a right answer.
`single_app`: `number_app` taking one session at a time.
`tools_app`: an MCPEnvironment whose FastMCP tools (add, submit) the agent calls; `submit` with 5
ends the episode with reward 1.0.
"""

from __future__ import annotations

import re
from uuid import uuid4

from fastmcp import FastMCP
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class MessageAction(Action):
    message: str = Field(..., description="what the agent says")


class PromptObservation(Observation):
    prompt: str = ""


class NumberEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        self._state = State(episode_id=str(uuid4()), step_count=0)

    def reset(self, seed=None, episode_id=None, **kwargs) -> PromptObservation:  # noqa: ANN001
        self._state = State(episode_id=str(uuid4()), step_count=0)
        return PromptObservation(prompt="Reply with one number larger than 7.", done=False, reward=0.0)

    def step(self, action: MessageAction, timeout_s=None, **kwargs) -> PromptObservation:  # type: ignore[override]  # noqa: ANN001
        self._state.step_count += 1
        numbers = [float(n) for n in re.findall(r"-?\d+(?:\.\d+)?", action.message)]
        right = bool(numbers) and numbers[0] > 7
        done = right or self._state.step_count >= 2
        prompt = "Correct." if right else "That is not a number larger than 7. Try again."
        return PromptObservation(prompt=prompt, done=done, reward=1.0 if right else 0.0)

    @property
    def state(self) -> State:
        return self._state


class ToolsEnvironment(MCPEnvironment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        mcp = FastMCP("calculator")
        self.submitted: float | None = None

        @mcp.tool()
        def add(a: int, b: int) -> int:
            """Add two integers."""
            return a + b

        @mcp.tool()
        def submit(answer: int) -> str:
            """Submit the final answer."""
            self.submitted = answer
            return "submitted"

        super().__init__(mcp)
        self._state = State(episode_id=str(uuid4()), step_count=0)

    def reset(self, seed=None, episode_id=None, **kwargs) -> Observation:  # noqa: ANN001
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self.submitted = None
        return PromptObservation(prompt="What is 2 + 3? Use add, then submit the result.", done=False, reward=0.0)

    def _scored(self, action, observation: Observation) -> Observation:  # noqa: ANN001
        self._state.step_count += 1
        if (
            isinstance(action, CallToolAction)
            and action.tool_name == "submit"
            and isinstance(observation, CallToolObservation)
        ):
            observation.done = True
            observation.reward = 1.0 if self.submitted == 5 else 0.0
        return observation

    def step(self, action, timeout_s=None, **kwargs) -> Observation:  # type: ignore[override]  # noqa: ANN001
        return self._scored(action, super().step(action, timeout_s=timeout_s, **kwargs))

    async def step_async(self, action, timeout_s=None, **kwargs) -> Observation:  # type: ignore[override]  # noqa: ANN001
        return self._scored(action, await super().step_async(action, timeout_s=timeout_s, **kwargs))

    def _step_impl(self, action, timeout_s=None, **kwargs) -> Observation:  # noqa: ANN001
        return PromptObservation(prompt="Call a tool.", done=False, reward=0.0)

    @property
    def state(self) -> State:
        return self._state


number_app = create_app(NumberEnvironment, MessageAction, PromptObservation, env_name="number", max_concurrent_envs=8)
single_app = create_app(NumberEnvironment, MessageAction, PromptObservation, env_name="number", max_concurrent_envs=1)
tools_app = create_app(ToolsEnvironment, CallToolAction, CallToolObservation, env_name="tools", max_concurrent_envs=8)
