"""ART's `art.mcp` (MCP-RL) on agentrl.mcp: tool and resource records, generated scenarios, the
`complete_task` tool, and `generate_scenarios`, which asks any litellm model (or an agentrl Model)
to write tasks from an MCP server's tools. Training on them is agentrl's `train_mcp_rl` or the
user's own RULER loop, as in ART's examples."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from pydantic import BaseModel, Field

from agentrl.client.model import JudgeModel, Model
from agentrl.mcp.agent import COMPLETE_TASK_TOOL
from agentrl.mcp.servers import openai_tool
from agentrl.mcp.tasks import generate_tasks

complete_task_tool = COMPLETE_TASK_TOOL
"""The tool an agent calls to end its attempt (OpenAI tool schema)."""


class MCPTool(BaseModel):
    """One tool an MCP server lists."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})

    def to_tool_schema(self) -> dict[str, Any]:
        """The tool as an OpenAI chat-completions tool."""
        return openai_tool(self.name, self.description, self.parameters)


class MCPResource(BaseModel):
    """One resource an MCP server lists."""

    uri: str
    name: str
    description: str = ""
    mime_type: str | None = None


class GeneratedScenario(BaseModel):
    """A task written from the tools, with its difficulty (1 easy - 5 hard)."""

    task: str
    difficulty: int = Field(ge=1, le=5)


class GeneratedScenarioCollection(BaseModel):
    """The scenarios `generate_scenarios` wrote, iterable like a list."""

    scenarios: list[GeneratedScenario]

    def __iter__(self) -> Iterator[GeneratedScenario]:  # type: ignore[override]
        return iter(self.scenarios)

    def __len__(self) -> int:
        return len(self.scenarios)

    def __getitem__(self, index: int) -> GeneratedScenario:
        return self.scenarios[index]

    def filter_by_difficulty(self, min_difficulty: int = 1, max_difficulty: int = 5) -> GeneratedScenarioCollection:
        return GeneratedScenarioCollection(
            scenarios=[s for s in self.scenarios if min_difficulty <= s.difficulty <= max_difficulty]
        )

    def get_difficulty_distribution(self) -> dict[int, int]:
        return {d: sum(s.difficulty == d for s in self.scenarios) for d in range(1, 6)}

    def preview(self, n: int = 5) -> None:
        for scenario in self.scenarios[:n]:
            print(f"[{scenario.difficulty}] {scenario.task}")


def _openai_tool(tool: Any) -> dict[str, Any]:
    """An MCPTool, an MCP SDK `Tool`, or an OpenAI tool dict, as an OpenAI tool dict."""
    if isinstance(tool, MCPTool):
        return tool.to_tool_schema()
    if isinstance(tool, dict):
        return tool if "function" in tool else MCPTool(**tool).to_tool_schema()
    schema = getattr(tool, "input_schema", None) or getattr(tool, "inputSchema", None)
    return openai_tool(tool.name, tool.description, schema)


def _resource(resource: Any) -> dict[str, Any]:
    if isinstance(resource, dict):
        return resource
    return {"uri": str(resource.uri), "name": resource.name, "description": resource.description or ""}


def _writer(model: str | Model, api_key: str | None, base_url: str | None) -> JudgeModel:
    if isinstance(model, Model) or (api_key is None and base_url is None):
        return model
    provider, _, name = model.partition("/") if "/" in model else ("openai", "", model)
    return Model(name=name, base_url=base_url, api_key=api_key, litellm_provider=provider)


async def generate_scenarios(
    tools: Sequence[Any],
    resources: Sequence[Any] = (),
    num_scenarios: int = 24,
    show_preview: bool = True,
    custom_instructions: str | None = None,
    generator_model: str | Model = "openai/gpt-4.1-mini",
    generator_api_key: str | None = None,
    generator_base_url: str | None = None,
) -> GeneratedScenarioCollection:
    """`num_scenarios` distinct tasks an agent with `tools` could be given, written by `generator_model`."""
    tasks = await generate_tasks(
        [_openai_tool(t) for t in tools],
        num_scenarios,
        _writer(generator_model, generator_api_key, generator_base_url),
        resources=[_resource(r) for r in resources],
        custom_instructions=custom_instructions,
    )
    collection = GeneratedScenarioCollection(
        scenarios=[GeneratedScenario(task=t.task, difficulty=t.difficulty) for t in tasks]
    )
    if show_preview:
        collection.preview()
    return collection


__all__ = [
    "GeneratedScenario",
    "GeneratedScenarioCollection",
    "MCPResource",
    "MCPTool",
    "complete_task_tool",
    "generate_scenarios",
]
