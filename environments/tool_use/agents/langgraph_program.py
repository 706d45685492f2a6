"""The tool-use agent with LangGraph (its prebuilt ReAct agent on langchain-openai), as its own program:
`python -m agentrl_environments.tool_use.agents.langgraph_program MODEL SPLIT QUESTION_INDEX`.

It knows only OPENAI_BASE_URL and OPENAI_API_KEY (a rollout session's, when agentrl runs it) and prints its final
answer. Its turns are bounded by the graph's recursion limit (two steps a turn), and running past it ends the
rollout, not the program.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.errors import GraphRecursionError
from langgraph.prebuilt import create_react_agent

from ..env import SYSTEM_PROMPT
from ..task import Question, execute, questions


def build_agent(model: str, question: Question, *, max_tokens: int) -> Any:  # LangGraph's compiled graph
    """The agent, its tools bound to this question's hidden price list (every result as the task's tools give it)."""

    def run(name: str, **arguments: object) -> str:
        return execute(name, json.dumps(arguments), question.prices).content

    @tool
    def add(a: int, b: int) -> str:
        """Add two integers."""
        return run("add", a=a, b=b)

    @tool
    def multiply(a: int, b: int) -> str:
        """Multiply two integers."""
        return run("multiply", a=a, b=b)

    @tool
    def lookup_price(item: str) -> str:
        """The price in dollars of an item in the shop."""
        return run("lookup_price", item=item)

    @tool
    def convert_units(value: float, from_unit: str, to_unit: str) -> str:
        """Convert a quantity from one unit to another."""
        return run("convert_units", value=value, from_unit=from_unit, to_unit=to_unit)

    llm = ChatOpenAI(
        model=model,
        base_url=os.environ["OPENAI_BASE_URL"],
        api_key=os.environ["OPENAI_API_KEY"],
        max_tokens=max_tokens,
        temperature=1.0,
    )
    return create_react_agent(llm, [add, multiply, lookup_price, convert_units], prompt=SYSTEM_PROMPT)


async def main(model: str, split: str, index: int, *, max_turns: int = 4, max_tokens: int = 64) -> str:
    question = questions(split, index + 1)[index]
    agent = build_agent(model, question, max_tokens=max_tokens)
    try:
        state = await agent.ainvoke({"messages": [HumanMessage(question.question)]}, {"recursion_limit": 2 * max_turns})
    except GraphRecursionError:  # out of turns: the turns so far are the rollout
        return ""
    return str(state["messages"][-1].content)


if __name__ == "__main__":
    print(asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]))))
