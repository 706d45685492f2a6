"""The agent's tools as OpenAI tool schemas, and their execution against one bound inbox.

The inbox is bound by the environment, never passed by the model. A call that cannot run (unknown
tool, arguments that are not JSON or not the right fields) returns an error text the model can read
and recover from; the rollout counts it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from environments.email_agent.mailbox import Mailbox

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "search_emails",
        "description": "Search the inbox. Returns message ids, subjects and snippets of emails containing all the keywords.",
        "parameters": {"type": "object", "properties": {
            "keywords": {"type": "string", "description": "words that must appear in the email"},
            "from_addr": {"type": "string"}, "to_addr": {"type": "string"},
            "sent_after": {"type": "string", "description": "ISO date, e.g. 2026-03-01"},
            "sent_before": {"type": "string", "description": "ISO date"},
            "max_results": {"type": "integer", "default": 10}},
            "required": ["keywords"]}}},
    {"type": "function", "function": {
        "name": "read_email",
        "description": "Read one email by its message id.",
        "parameters": {"type": "object", "properties": {"message_id": {"type": "string"}}, "required": ["message_id"]}}},
    {"type": "function", "function": {
        "name": "return_final_answer",
        "description": "Give the final answer to the question, with the message ids of the emails it comes from. Say \"I don't know\" if the inbox does not tell.",
        "parameters": {"type": "object", "properties": {
            "answer": {"type": "string"}, "sources": {"type": "array", "items": {"type": "string"}}},
            "required": ["answer", "sources"]}}},
]  # fmt: skip
TOOL_NAMES = {t["function"]["name"] for t in TOOLS}


@dataclass(frozen=True)
class ToolOutcome:
    """What a tool call produced: the text shown to the model, and what the reward needs to know."""

    content: str
    malformed: bool = False
    final_answer: str | None = None
    sources: tuple[str, ...] = ()
    found_ids: tuple[str, ...] = ()  # search results
    read_id: str | None = None


def _error(text: str) -> ToolOutcome:
    return ToolOutcome(content=f"Error: {text}", malformed=True)


def execute(mailbox: Mailbox, name: str, arguments: str) -> ToolOutcome:
    """Run one tool call; never raises for anything the model wrote."""
    if name not in TOOL_NAMES:
        return _error(f"unknown tool {name!r}; the tools are {sorted(TOOL_NAMES)}")
    try:
        args = json.loads(arguments) if arguments else {}
    except json.JSONDecodeError:
        return _error(f"the arguments of {name} are not valid JSON: {arguments[:200]!r}")
    if not isinstance(args, dict):
        return _error(f"the arguments of {name} must be a JSON object")
    try:
        if name == "search_emails":
            hits = mailbox.search(
                str(args["keywords"]), from_addr=args.get("from_addr"), to_addr=args.get("to_addr"),
                sent_after=args.get("sent_after"), sent_before=args.get("sent_before"),
                max_results=int(args.get("max_results", 10)),
            )  # fmt: skip
            if not hits:
                return ToolOutcome(content="No emails found. Try fewer or other keywords.")
            return ToolOutcome(
                content=json.dumps([asdict(h) for h in hits]), found_ids=tuple(h.message_id for h in hits)
            )
        if name == "read_email":
            email = mailbox.read(str(args["message_id"]))
            if email is None:
                return ToolOutcome(content=f"No email with id {args['message_id']!r} in this inbox.")
            return ToolOutcome(content=json.dumps(email), read_id=email["message_id"])
        sources = args.get("sources") or []
        if not isinstance(sources, list):
            sources = [sources]
        return ToolOutcome(
            content="Answer recorded.", final_answer=str(args["answer"]), sources=tuple(map(str, sources))
        )
    except KeyError as missing:
        return _error(f"{name} needs the argument {missing.args[0]!r}")
    except (TypeError, ValueError) as error:
        return _error(f"bad arguments for {name}: {error}")
