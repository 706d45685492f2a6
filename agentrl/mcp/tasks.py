"""Tasks written by an LLM from an MCP server's tools: the training data of MCP-RL.

The writer sees the tools (and resources) and returns JSON that matches a schema; on a vLLM-served
writer the schema constrains decoding, so even a small model's answer parses. Tasks are asked for
in batches, duplicates dropped, and asked again until there are enough or the attempts run out.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from pydantic import BaseModel, Field

from agentrl.client.model import JudgeModel
from agentrl.foundation.errors import ConfigurationError, JudgeError
from agentrl.judges.call import InvalidJudgeAnswer, structured_judge_call

TASKS_PER_CALL = 6
MAX_ROUNDS = 6


class MCPTask(BaseModel):
    """One task for the agent, how hard its writer thinks it is (1-5), and anything a check needs
    (`metadata`: an expected answer, which server to connect)."""

    task: str = Field(min_length=1)
    difficulty: int = Field(default=3, ge=1, le=5)
    metadata: dict[str, Any] = Field(default_factory=dict)


class _WrittenTask(BaseModel):
    task: str
    difficulty: int = Field(ge=1, le=5)


class _TaskBatch(BaseModel):
    tasks: list[_WrittenTask]


def describe_tools(tools: list[dict[str, Any]], resources: list[dict[str, Any]] | None = None) -> str:
    """The tools (and resources) as the task writer reads them."""
    lines = []
    for tool in tools:
        function = tool["function"]
        arguments = ", ".join(function.get("parameters", {}).get("properties", {}))
        lines.append(f"- {function['name']}({arguments}): {function.get('description', '')}")
    for resource in resources or []:
        lines.append(f"- resource {resource['uri']}: {resource.get('description') or resource.get('name', '')}")
    return "\n".join(lines)


def _prompt(tools_text: str, count: int, custom_instructions: str | None) -> list[dict[str, str]]:
    instructions = (
        f"An AI assistant can use only these tools:\n{tools_text}\n\n"
        f"Write {count} different tasks a user could give this assistant, each one solvable with these tools "
        "alone, from easy (difficulty 1) to hard (5). Each task is one or two sentences a user would type. "
        'Answer with JSON: {"tasks": [{"task": "...", "difficulty": 1}, ...]}'
    )
    if custom_instructions:
        instructions += f"\n\n{custom_instructions}"
    return [{"role": "user", "content": instructions}]


def _key(task: str) -> str:
    return " ".join(task.lower().split())


async def generate_tasks(  # noqa: C901 - over the limit when the rule came on; split it when next changed
    tools: list[dict[str, Any]],
    num_tasks: int,
    writer: JudgeModel,
    *,
    resources: list[dict[str, Any]] | None = None,
    custom_instructions: str | None = None,
    temperature: float = 1.0,
    max_tokens: int = 1024,
) -> list[MCPTask]:
    """`num_tasks` distinct tasks for an agent that has `tools`, written by `writer` (a litellm id or a Model).

    Raises `JudgeError` when the writer cannot give that many distinct tasks in its attempts."""
    if num_tasks < 1:
        raise ConfigurationError(f"num_tasks must be at least 1, got {num_tasks}")
    if not tools:
        raise ConfigurationError("no tools to write tasks for: the MCP server listed none")
    tools_text = describe_tools(tools, resources)
    found: dict[str, MCPTask] = {}

    def keep_some(batch: _TaskBatch) -> _TaskBatch:
        if not any(t.task.strip() for t in batch.tasks):
            raise InvalidJudgeAnswer("the writer returned no task")
        return batch

    for _ in range(MAX_ROUNDS):
        missing = num_tasks - len(found)
        if missing <= 0:
            break
        counts = [min(TASKS_PER_CALL, missing - start) for start in range(0, missing, TASKS_PER_CALL)]
        calls = [
            structured_judge_call(
                writer,
                _prompt(tools_text, count, custom_instructions),
                _TaskBatch,
                keep_some,
                extra_litellm_params={"temperature": temperature, "max_tokens": max_tokens},
                max_items=count,
            )
            for count in counts
        ]
        for call in await asyncio.gather(*calls):
            for task in call.answer.tasks:
                if task.task.strip() and _key(task.task) not in found:
                    found[_key(task.task)] = MCPTask(task=task.task.strip(), difficulty=task.difficulty)
    if len(found) < num_tasks:
        raise JudgeError(
            f"the task writer gave {len(found)} distinct tasks of the {num_tasks} asked for in {MAX_ROUNDS} rounds; "
            "ask for fewer, or use a stronger writer model"
        )
    return list(found.values())[:num_tasks]


def tasks_to_jsonl(tasks: list[MCPTask]) -> str:
    return "".join(json.dumps(t.model_dump()) + "\n" for t in tasks)
