"""The Anthropic Messages API on the gateway, translated to and from chat completions.

A request becomes chat messages (`system` a system message, `tool_use` blocks an assistant turn's tool
calls, `tool_result` blocks tool messages) and is sampled as a chat completion, which returns the
exact token ids; the answer is a Messages object (text and `tool_use` blocks, `stop_reason`) with the
gateway's stamps (`completion_id` = the message id, `policy_step`, `token_ids`) as extra fields, so
`Trajectory.messages_and_choices.append(message)` trains on the exact tokens (taken from the gateway's
store by that id). Streams are told as the
Messages API's events; `MessageStream` joins them back for capture.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from agentrl.gateway.chunks import ServerSentEvents
from agentrl.gateway.limits import RequestRefused
from agentrl.gateway.translate import chat_choice, stamped

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
IGNORED_FIELDS = {"metadata", "service_tier", "thinking", "container", "mcp_servers", "context_management"}


def _refuse(message: str) -> RequestRefused:
    return RequestRefused(400, message)


def _arguments(tool_input: Any) -> str:
    return json.dumps(tool_input if tool_input is not None else {}, ensure_ascii=False)


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
        raise _refuse(f"{where}: 'content' must be a string or a list of content blocks")
    return content


def _tool_result_text(block: dict[str, Any], where: str) -> str:
    content = block.get("content")
    if content is None or isinstance(content, str):
        text = content or ""
    else:
        parts = _blocks(content, where)
        if any(p.get("type") != "text" for p in parts):
            raise _refuse(f"{where}: tool_result content may hold text blocks only")
        text = "".join(p.get("text") or "" for p in parts)
    return f"Error: {text}" if block.get("is_error") and not text.startswith("Error") else text


def messages_from_anthropic(messages: Any, system: Any = None) -> list[dict[str, Any]]:  # noqa: C901 - over the limit when the rule came on; split it when next changed
    """Chat messages from a Messages request's `system` and `messages`."""
    chat: list[dict[str, Any]] = []
    if system:
        text = system if isinstance(system, str) else "".join(b.get("text") or "" for b in _blocks(system, "system"))
        chat.append({"role": "system", "content": text})
    if not isinstance(messages, list) or not messages:
        raise _refuse("'messages' must be a non-empty list of {role, content} objects")
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("user", "assistant"):
            raise _refuse(f"{where}: role must be 'user' or 'assistant', got {role!r}")
        texts, calls, results = [], [], []
        for j, block in enumerate(_blocks(message.get("content"), where)):
            kind = block.get("type")
            if kind == "text":
                texts.append(block.get("text") or "")
            elif kind == "tool_use" and role == "assistant":
                calls.append(
                    {
                        "id": block.get("id"),
                        "type": "function",
                        "function": {"name": block.get("name"), "arguments": _arguments(block.get("input"))},
                    }
                )
            elif kind == "tool_result" and role == "user":
                results.append(
                    {
                        "role": "tool",
                        "tool_call_id": block.get("tool_use_id"),
                        "content": _tool_result_text(block, f"{where}.content[{j}]"),
                    }
                )
            elif kind in ("thinking", "redacted_thinking"):
                continue
            else:
                raise _refuse(f"{where}.content[{j}]: a {role} block of type {kind!r} is not supported here")
        if role == "assistant":
            turn: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or (None if calls else "")}
            if calls:
                turn["tool_calls"] = calls
            chat.append(turn)
        else:
            chat += results  # tool results answer the previous turn's calls, before any new text
            if texts or not results:
                chat.append({"role": "user", "content": "".join(texts)})
    return chat


def _chat_tools(tools: Any) -> list[dict[str, Any]] | None:
    if not tools:
        return None
    chat_tools = []
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str) or "input_schema" not in tool:
            raise _refuse(
                f"tools[{index}] must be a custom tool with 'name' and 'input_schema' (server tools do not run here)"
            )
        # Keys in the order vLLM renders them, so the prompt the engine renders is the one a re-rendering gives.
        function: dict[str, Any] = {"name": tool["name"]}
        if tool.get("description"):
            function["description"] = tool["description"]
        function["parameters"] = tool["input_schema"]
        chat_tools.append({"type": "function", "function": function})
    return chat_tools


def _chat_tool_choice(choice: Any) -> Any:
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    mapped = {"auto": "auto", "any": "required", "none": "none"}.get(kind or "")
    if mapped is None:
        raise _refuse(f"tool_choice {choice!r} is not supported: use auto, any, none or tool")
    return mapped


def chat_request(body: dict[str, Any]) -> dict[str, Any]:
    """The chat-completions body for a Messages request."""
    known = {
        "model", "messages", "system", "max_tokens", "temperature", "top_p", "top_k", "stop_sequences", "tools",
        "tool_choice", "stream",
    }  # fmt: skip
    if unknown := set(body) - known - IGNORED_FIELDS:
        raise _refuse(f"Messages fields not supported by the gateway: {sorted(unknown)}")
    if not isinstance(body.get("max_tokens"), int):
        raise _refuse("'max_tokens' is required (an integer), as the Messages API requires it")
    chat: dict[str, Any] = {
        "model": body.get("model"),
        "messages": messages_from_anthropic(body.get("messages"), body.get("system")),
        "max_tokens": body["max_tokens"],
    }
    for key in ("temperature", "top_p", "top_k"):
        if body.get(key) is not None:
            chat[key] = body[key]
    if body.get("stop_sequences"):
        chat["stop"] = list(body["stop_sequences"])
    if tools := _chat_tools(body.get("tools")):
        chat["tools"] = tools
        if body.get("tool_choice") is not None:
            chat["tool_choice"] = _chat_tool_choice(body["tool_choice"])
    if body.get("stream"):
        chat["stream"] = True
    return chat


def new_message_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


def _tool_input(arguments: str) -> Any:
    try:
        value = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _stop_reason(finish_reason: str | None, called_tools: bool) -> str:
    """Why the turn ended, in Messages terms: a turn that ends in tool calls is `tool_use` (vLLM says "stop"
    after a named tool choice)."""
    if finish_reason == "length":
        return "max_tokens"
    return "tool_use" if called_tools else STOP_REASONS.get(finish_reason or "stop", "end_turn")


def message_object(message_id: str, chat_answer: dict[str, Any]) -> dict[str, Any]:
    """The Messages object for a chat completion's first choice, with the gateway's stamps."""
    choice = (chat_answer.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    content: list[dict[str, Any]] = [{"type": "text", "text": message["content"]}] if message.get("content") else []
    for call in message.get("tool_calls") or []:
        function = call["function"]
        content.append(
            {
                "type": "tool_use",
                "id": call["id"],
                "name": function["name"],
                "input": _tool_input(function["arguments"]),
            }
        )
    usage = chat_answer.get("usage") or {}
    answer = {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": chat_answer.get("model"),
        "content": content,
        "stop_reason": _stop_reason(choice.get("finish_reason"), bool(message.get("tool_calls"))),
        "stop_sequence": None,
        "usage": {"input_tokens": usage.get("prompt_tokens", 0), "output_tokens": usage.get("completion_tokens", 0)},
    }
    return stamped(answer, choice)


def choice_fields(message: dict[str, Any]) -> dict[str, Any]:
    """A chat Choice's fields from a Messages object (text joined, tool_use blocks as tool calls, the
    gateway's stamps kept): how a trajectory holds a message."""
    texts, tool_calls = [], []
    for block in message.get("content") or []:
        if block.get("type") == "text":
            texts.append(block.get("text") or "")
        elif block.get("type") == "tool_use":
            function = {"name": block["name"], "arguments": _arguments(block.get("input"))}
            tool_calls.append({"id": block["id"], "type": "function", "function": function})
    finish = {v: k for k, v in STOP_REASONS.items()}.get(message.get("stop_reason") or "end_turn", "stop")
    return chat_choice(texts, tool_calls, finish, message)


def _sse(kind: str, data: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data}, separators=(',', ':'))}\n\n".encode()


class MessageEvents:
    """A streamed chat completion told as Messages server-sent events, chunk by chunk."""

    def __init__(self, message_id: str) -> None:
        self.message_id = message_id
        self.open_block: int | None = None
        self.blocks = 0
        self.text_block: int | None = None
        self.call_blocks: dict[int, int] = {}

    def cut(self, message: str) -> bytes:
        """The error event that ends a stream whose server went away (Anthropic's clients raise on it)."""
        return _sse("error", {"error": {"type": "api_error", "message": message}})

    def start(self, model: str | None, stamps: dict[str, Any]) -> list[bytes]:
        shell = {
            "id": self.message_id, "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 0, "output_tokens": 0}, **stamps,
        }  # fmt: skip
        return [_sse("message_start", {"message": shell})]

    def _open(self, block: dict[str, Any]) -> list[bytes]:
        events = self._close()
        self.open_block = self.blocks
        self.blocks += 1
        return [*events, _sse("content_block_start", {"index": self.open_block, "content_block": block})]

    def _close(self) -> list[bytes]:
        if self.open_block is None:
            return []
        closed, self.open_block = self.open_block, None
        return [_sse("content_block_stop", {"index": closed})]

    def add(self, chunk: dict[str, Any]) -> list[bytes]:
        events: list[bytes] = []
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if delta.get("content"):
                if self.text_block is None or self.open_block != self.text_block:
                    events += self._open({"type": "text", "text": ""})
                    self.text_block = self.open_block
                text_delta = {"type": "text_delta", "text": delta["content"]}
                events.append(_sse("content_block_delta", {"index": self.text_block, "delta": text_delta}))
            for call in delta.get("tool_calls") or []:
                index, function = call.get("index", 0), call.get("function") or {}
                if index not in self.call_blocks:
                    block = {"type": "tool_use", "id": call.get("id"), "name": function.get("name"), "input": {}}
                    events += self._open(block)
                    self.call_blocks[index] = self.open_block  # type: ignore[assignment]
                if function.get("arguments"):
                    json_delta = {"type": "input_json_delta", "partial_json": function["arguments"]}
                    events.append(_sse("content_block_delta", {"index": self.call_blocks[index], "delta": json_delta}))
        return events

    def finish(self, chat_answer: dict[str, Any]) -> list[bytes]:
        final = message_object(self.message_id, chat_answer)
        delta = {"stop_reason": final["stop_reason"], "stop_sequence": None}
        return [
            *self._close(),
            _sse("message_delta", {"delta": delta, "usage": {"output_tokens": final["usage"]["output_tokens"]}}),
            _sse("message_stop", {}),
        ]


class MessageStream(ServerSentEvents):
    """A Messages event stream joined back into the Messages object (for capture), fed raw bytes."""

    def __init__(self) -> None:
        super().__init__()
        self.message: dict[str, Any] = {}
        self.blocks: dict[int, dict[str, Any]] = {}
        self.partial_json: dict[int, str] = {}

    def add(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "message_start":
            self.message = dict(event["message"])
        elif kind == "content_block_start":
            self.blocks[event["index"]] = dict(event["content_block"])
        elif kind == "content_block_delta":
            delta, block = event["delta"], self.blocks[event["index"]]
            if delta.get("type") == "text_delta":
                block["text"] = block.get("text", "") + delta["text"]
            elif delta.get("type") == "input_json_delta":
                self.partial_json[event["index"]] = self.partial_json.get(event["index"], "") + delta["partial_json"]
        elif kind == "message_delta":
            self.message.update(event.get("delta") or {})
        elif kind == "message_stop":
            self.done = True

    def answer(self) -> dict[str, Any]:
        for index, text in self.partial_json.items():
            self.blocks[index]["input"] = _tool_input(text)
        return {**self.message, "content": [self.blocks[i] for i in sorted(self.blocks)]}
