"""The one tool-calling agent loop: sample, run each tool call on its MCP server, append the result.

Each sampled `Choice` goes into the trajectory as it came, so its exact tokens train; tool results
go in as `tool` messages. The loop ends when the model answers without a tool call, calls
`complete_task` (offered with `offer_complete_task=True`), or reaches `max_turns`.
"""

from __future__ import annotations

import json
from typing import Any, cast

from agentrl.client.model import Model
from agentrl.data.trajectory import Trajectory
from agentrl.mcp.servers import MCPToolbox

COMPLETE_TASK = "complete_task"
COMPLETE_TASK_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": COMPLETE_TASK,
        "description": "Call this when the task is done (or cannot be done), with a short summary of the result.",
        "parameters": {
            "type": "object",
            "properties": {"summary": {"type": "string", "description": "what was found or done"}},
            "required": ["summary"],
        },
    },
}


def _summary_of(arguments: str | None) -> str:
    try:
        parsed = json.loads(arguments or "{}")
    except ValueError:
        return arguments or ""
    return str(parsed.get("summary", "")) if isinstance(parsed, dict) else str(parsed)


async def run_agent(
    model: Model,
    toolbox: MCPToolbox,
    messages: list[dict[str, Any]],
    *,
    max_turns: int = 8,
    max_tokens: int = 256,
    temperature: float = 1.0,
    offer_complete_task: bool = False,
    metadata: dict[str, Any] | None = None,
) -> Trajectory:
    """One rollout of `model` with `toolbox`'s tools, starting from `messages`; the reward is left to the caller.

    `metrics` count turns, tool calls, tool errors and timeouts; `metadata["final_answer"]` holds the
    last answer (the `complete_task` summary, or the last reply without a tool call)."""
    tools = [*toolbox.tools, COMPLETE_TASK_TOOL] if offer_complete_task else list(toolbox.tools)
    trajectory = Trajectory(messages_and_choices=list(messages), tools=tools, metadata=dict(metadata or {}))
    client = model.openai_client()
    counts = {"turns": 0, "tool_calls": 0, "tool_errors": 0, "tool_timeouts": 0}
    final_answer: str | None = None
    completed = False
    while counts["turns"] < max_turns and not completed:
        counts["turns"] += 1
        completion = await client.chat.completions.create(
            model=model.inference_name,
            messages=cast(Any, trajectory.messages()),  # dicts, not TypedDicts
            tools=cast(Any, tools),
            max_tokens=max_tokens,
            temperature=temperature,
        )
        choice = completion.choices[0]
        trajectory.messages_and_choices.append(choice)
        calls = choice.message.tool_calls or []
        if not calls:
            final_answer = choice.message.content or ""
            break
        for call in calls:
            if call.type != "function":  # a custom (free-text) tool call: no MCP tool takes one
                trajectory.messages_and_choices.append(
                    {"role": "tool", "tool_call_id": call.id, "content": "Error: only function tools exist here"}
                )
                counts["tool_errors"] += 1
                continue
            name = call.function.name
            counts["tool_calls"] += 1
            if offer_complete_task and name == COMPLETE_TASK:
                final_answer, completed = _summary_of(call.function.arguments), True
                content = "Task marked complete."
            else:
                result = await toolbox.call(name, call.function.arguments)
                counts["tool_errors"] += result.is_error
                counts["tool_timeouts"] += result.timed_out
                content = result.content
            trajectory.messages_and_choices.append({"role": "tool", "tool_call_id": call.id, "content": content})
    trajectory.metadata["final_answer"] = final_answer or ""
    trajectory.metrics.update(counts, completed_task=completed)
    return trajectory
