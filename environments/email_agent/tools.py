"""The agent's tools as OpenAI tool schemas, and their execution against one bound inbox.

The inbox is bound by the environment, never passed by the model. A call that cannot run (unknown
tool, arguments that are not JSON or not the right fields) returns an error text the model can read
and recover from; the rollout counts it.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import Any

from .mailbox import Mailbox

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "search_emails",
            "description": "Search the inbox. Returns message ids, subjects and snippets of emails containing all the keywords.",
            "parameters": {
                "type": "object",
                "properties": {
                    "keywords": {"type": "string", "description": "words that must appear in the email"},
                    "from_addr": {"type": "string"},
                    "to_addr": {"type": "string"},
                    "sent_after": {"type": "string", "description": "ISO date, e.g. 2026-03-01"},
                    "sent_before": {"type": "string", "description": "ISO date"},
                    "max_results": {"type": "integer", "default": 10},
                },
                "required": ["keywords"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_email",
            "description": "Read one email by its message id.",
            "parameters": {
                "type": "object",
                "properties": {"message_id": {"type": "string"}},
                "required": ["message_id"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "return_final_answer",
            "description": 'Give the final answer to the question, with the message ids of the emails it comes from. Say "I don\'t know" if the inbox does not tell.',
            "parameters": {
                "type": "object",
                "properties": {"answer": {"type": "string"}, "sources": {"type": "array", "items": {"type": "string"}}},
                "required": ["answer", "sources"],
            },
        },
    },
]
TOOL_NAMES = {t["function"]["name"] for t in TOOLS}
TOOL_SCHEMAS: dict[str, dict[str, Any]] = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


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


class _BadArgument(ValueError):
    """A model-written argument that does not fit its tool's schema; its text goes back to the model."""


def _coerce(name: str, value: Any, schema: dict[str, Any]) -> Any:
    """`value` as the schema's type: strings (numbers are spelled out), integers, lists of strings."""
    kind = schema.get("type")
    if kind == "string":
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return str(value)
    elif kind == "integer":
        number = value
        if isinstance(value, str) and value.strip().lstrip("-").isdigit() and len(value) < 10:
            number = int(value)
        if isinstance(number, float) and math.isfinite(number) and number.is_integer():
            number = int(number)
        if isinstance(number, int) and not isinstance(number, bool):
            return number
    elif kind == "array":
        items = value if isinstance(value, list) else [value]
        return [_coerce(f"{name}[{i}]", item, schema["items"]) for i, item in enumerate(items)]
    raise _BadArgument(f"argument {name!r} must be a JSON {kind}, got {type(value).__name__} {str(value)[:80]!r}")


def _arguments(name: str, arguments: Any) -> dict[str, Any]:
    """The call's arguments checked against its tool's schema; `_BadArgument` says what is wrong."""
    if not isinstance(arguments, str):
        raise _BadArgument(f"the arguments of {name} must be a JSON string")
    try:
        args = json.loads(arguments) if arguments.strip() else {}
    except (ValueError, RecursionError):  # invalid JSON, numbers too long, or nesting too deep for the parser
        raise _BadArgument(f"the arguments of {name} are not valid JSON: {arguments[:200]!r}") from None
    if not isinstance(args, dict):
        raise _BadArgument(f"the arguments of {name} must be a JSON object")
    parameters = TOOL_SCHEMAS[name]
    missing = [k for k in parameters["required"] if args.get(k) is None]
    if missing:
        raise _BadArgument(f"{name} needs the argument {missing[0]!r}")
    unknown = sorted(set(args) - set(parameters["properties"]))
    if unknown:
        raise _BadArgument(f"{name} takes no argument {unknown[0]!r}; it takes {sorted(parameters['properties'])}")
    return {k: _coerce(k, v, parameters["properties"][k]) for k, v in args.items() if v is not None}


def execute(mailbox: Mailbox, name: str, arguments: str) -> ToolOutcome:
    """Run one tool call; never raises for anything the model wrote (tested with 1,000 random calls)."""
    if name not in TOOL_NAMES:
        return _error(f"unknown tool {name!r}; the tools are {sorted(TOOL_NAMES)}")
    try:
        args = _arguments(name, arguments)
    except _BadArgument as error:
        return _error(str(error))
    if name == "search_emails":
        hits = mailbox.search(
            args["keywords"],
            from_addr=args.get("from_addr"),
            to_addr=args.get("to_addr"),
            sent_after=args.get("sent_after"),
            sent_before=args.get("sent_before"),
            max_results=max(1, min(args.get("max_results", 10), 50)),
        )
        if not hits:
            return ToolOutcome(content="No emails found. Try fewer or other keywords.")
        return ToolOutcome(content=json.dumps([asdict(h) for h in hits]), found_ids=tuple(h.message_id for h in hits))
    if name == "read_email":
        email = mailbox.read(args["message_id"])
        if email is None:
            return ToolOutcome(content=f"No email with id {args['message_id']!r} in this inbox.")
        return ToolOutcome(content=json.dumps(email), read_id=email["message_id"])
    return ToolOutcome(content="Answer recorded.", final_answer=args["answer"], sources=tuple(args["sources"]))
