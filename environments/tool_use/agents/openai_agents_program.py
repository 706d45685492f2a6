"""The tool-use agent with the OpenAI Agents SDK, as its own program: `python -m
agentrl_environments.tool_use.agents.openai_agents_program MODEL SPLIT QUESTION_INDEX MAX_TURNS MAX_TOKENS`.

It knows only OPENAI_BASE_URL and OPENAI_API_KEY (a rollout session's, when agentrl runs it) and prints its final
answer. The SDK's traps on a local model, handled here: its tracing would upload each run to OpenAI with the
session's key (off); the Responses model would work too, chat completions is what every local server speaks;
`tool_choice="auto"` and `max_tokens` are set, and running out of turns ends the rollout, not the program.
"""

from __future__ import annotations

import asyncio
import sys

from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from agents.exceptions import AgentsException
from openai import AsyncOpenAI

from ..env import SYSTEM_PROMPT
from ..task import Question, python_tools, question_at


def build_agent(model: str, question: Question, *, max_tokens: int) -> Agent:
    """The agent, its tools bound to this question's hidden price list."""
    return Agent(
        name="tool-use",
        instructions=SYSTEM_PROMPT,
        tools=[function_tool(function) for function in python_tools(question)],
        model=OpenAIChatCompletionsModel(model=model, openai_client=AsyncOpenAI()),
        model_settings=ModelSettings(tool_choice="auto", max_tokens=max_tokens, temperature=1.0),
    )


async def main(model: str, question: Question, *, max_turns: int, max_tokens: int) -> str:
    set_tracing_disabled(True)
    agent = build_agent(model, question, max_tokens=max_tokens)
    try:
        result = await Runner.run(agent, question.question, max_turns=max_turns)
    except AgentsException:  # out of turns, or a reply the SDK cannot use: the turns so far are the rollout
        return ""
    return str(result.final_output)


if __name__ == "__main__":
    model, split, index, max_turns, max_tokens = sys.argv[1:]
    question = question_at(split, int(index))
    print(asyncio.run(main(model, question, max_turns=int(max_turns), max_tokens=int(max_tokens))))
