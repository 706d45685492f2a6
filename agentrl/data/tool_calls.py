"""Tool-call text the server did not parse into a call: what `tool_call_parse_failures` counts.

A model that writes a call's opening tag and then something the server's parser cannot read gets back
that text as content and no `tool_calls`. Under agentrl's tool-call grammar (`ServerConfig.tool_call_grammar`)
this happens only where a reply is cut off inside a call (its `max_tokens`); with the grammar off it is a
small model's most common tool failure. Counted per step and shown in the step's transcript.
"""

from __future__ import annotations

import re
from typing import Any

from openai.types.chat.chat_completion import Choice

from agentrl.data.trajectory_group import TrajectoryGroup

__all__ = ["tool_call_parse_failures", "unparsed_tool_calls"]
"""What environments may use: counting tool-call text the server could not parse."""

CALL_OPENERS = ("<tool_call>", "[TOOL_CALLS]", "<|python_tag|>", "<function=")
"""How the tool-call formats vLLM's parsers read open a call: Hermes, Mistral, Llama 3, Llama 4 / Qwen3-Coder."""
_OPENER = re.compile("|".join(re.escape(opener) for opener in CALL_OPENERS))


def unparsed_tool_calls(content: str | None) -> int:
    """How many calls an assistant message's content opens that were left as text (a parsed call's own text
    is not in its content)."""
    return len(_OPENER.findall(content)) if content else 0


def assistant_content(item: dict[str, Any] | Choice) -> str | None:
    """The text of a sampled or written assistant turn; None for any other message."""
    if isinstance(item, Choice):
        return item.message.content
    content = item.get("content") if item.get("role") == "assistant" else None
    return content if isinstance(content, str) else None


def tool_call_parse_failures(groups: list[TrajectoryGroup]) -> int | None:
    """Unparsed calls over every assistant turn of these groups; None where no history offered tools."""
    histories = [h for g in groups for t in g.trajectories for h in t.histories()]
    if not any(h.tools for h in histories):
        return None
    return sum(unparsed_tool_calls(assistant_content(m)) for h in histories for m in h.messages_and_choices)
