"""The tool-use agent with the OpenAI Agents SDK, as its own program: `python -m
agentrl_environments.tool_use.agents.openai_agents_program MODEL SPLIT QUESTION_INDEX`.

It knows only OPENAI_BASE_URL and OPENAI_API_KEY (a rollout session's, when agentrl runs it) and prints its final
answer. The SDK's traps on a local model, handled here: its tracing would upload each run to OpenAI with the
session's key (off); the Responses model would work too, chat completions is what every local server speaks;
`tool_choice="auto"` and `max_tokens` are set, and running out of turns ends the rollout, not the program.
"""

from __future__ import annotations

import asyncio
import json
import sys

from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from agents.exceptions import AgentsException
from openai import AsyncOpenAI

from ..env import SYSTEM_PROMPT
from ..task import Question, execute, questions


def build_agent(model: str, question: Question, *, max_tokens: int) -> Agent:
    """The agent, its tools bound to this question's hidden price list (every result as the task's tools give it)."""

    def run(name: str, **arguments: object) -> str:
        return execute(name, json.dumps(arguments), question.prices).content

    @function_tool
    def add(a: int, b: int) -> str:
        """Add two integers."""
        return run("add", a=a, b=b)

    @function_tool
    def multiply(a: int, b: int) -> str:
        """Multiply two integers."""
        return run("multiply", a=a, b=b)

    @function_tool
    def lookup_price(item: str) -> str:
        """The price in dollars of an item in the shop."""
        return run("lookup_price", item=item)

    @function_tool
    def convert_units(value: float, from_unit: str, to_unit: str) -> str:
        """Convert a quantity from one unit to another."""
        return run("convert_units", value=value, from_unit=from_unit, to_unit=to_unit)

    return Agent(
        name="tool-use",
        instructions=SYSTEM_PROMPT,
        tools=[add, multiply, lookup_price, convert_units],
        model=OpenAIChatCompletionsModel(model=model, openai_client=AsyncOpenAI()),
        model_settings=ModelSettings(tool_choice="auto", max_tokens=max_tokens, temperature=1.0),
    )


async def main(model: str, split: str, index: int, *, max_turns: int = 4, max_tokens: int = 64) -> str:
    set_tracing_disabled(True)
    question = questions(split, index + 1)[index]
    agent = build_agent(model, question, max_tokens=max_tokens)
    try:
        result = await Runner.run(agent, question.question, max_turns=max_turns)
    except AgentsException:  # out of turns, or a reply the SDK cannot use: the turns so far are the rollout
        return ""
    return str(result.final_output)


if __name__ == "__main__":
    print(asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]))))
