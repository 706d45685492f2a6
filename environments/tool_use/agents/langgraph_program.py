"""The tool-use agent with LangGraph (its prebuilt ReAct agent on langchain-openai), as its own program:
`python -m agentrl_environments.tool_use.agents.langgraph_program MODEL SPLIT QUESTION_INDEX MAX_TURNS MAX_TOKENS`.

It knows only OPENAI_BASE_URL and OPENAI_API_KEY (a rollout session's, when agentrl runs it) and prints its final
answer. Its turns are bounded by the graph's recursion limit (two steps a turn), and running past it ends the
rollout, not the program.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.errors import GraphRecursionError
from langgraph.prebuilt import create_react_agent

from ..env import SYSTEM_PROMPT
from ..task import Question, python_tools, question_at


def build_agent(model: str, question: Question, *, max_tokens: int) -> Any:  # LangGraph's compiled graph
    """The agent, its tools bound to this question's hidden price list."""
    llm = ChatOpenAI(
        model=model,
        base_url=os.environ["OPENAI_BASE_URL"],
        api_key=os.environ["OPENAI_API_KEY"],
        max_tokens=max_tokens,
        temperature=1.0,
    )
    return create_react_agent(llm, [tool(function) for function in python_tools(question)], prompt=SYSTEM_PROMPT)


async def main(model: str, question: Question, *, max_turns: int, max_tokens: int) -> str:
    agent = build_agent(model, question, max_tokens=max_tokens)
    try:
        state = await agent.ainvoke({"messages": [HumanMessage(question.question)]}, {"recursion_limit": 2 * max_turns})
    except GraphRecursionError:  # out of turns: the turns so far are the rollout
        return ""
    return str(state["messages"][-1].content)


if __name__ == "__main__":
    model, split, index, max_turns, max_tokens = sys.argv[1:]
    question = question_at(split, int(index))
    print(asyncio.run(main(model, question, max_turns=int(max_turns), max_tokens=int(max_tokens))))
