"""The OpenAI Responses API on the gateway, translated to and from chat completions.

vLLM's own /v1/responses returns no sampled token ids, so the gateway asks for a chat completion (which
does) and answers in the Responses format. A request becomes chat messages (`instructions` a system
message, input items messages, `function_call`/`function_call_output` items tool calls and tool
messages); `previous_response_id` continues a conversation the gateway answered (its thread is kept
by response id, without the earlier `instructions`, as OpenAI specifies). The answer's `output` holds
a message item (text, with its token logprobs) and one `function_call` item per tool call, and the
gateway's stamps (`completion_id` = the response id, `policy_step`, `token_ids`) ride along as extra
fields, so `Trajectory.messages_and_choices.append(response)` trains on the exact tokens (the trainer
takes them, with their logprobs, from the gateway's store by that id).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from agentrl.gateway.limits import RequestRefused
from agentrl.gateway.translate import chat_choice, stamped

logger = logging.getLogger(__name__)

Thread = list[dict[str, Any]]
"""A conversation as chat messages, without the `instructions` of the requests that built it."""

IGNORED_FIELDS = {
    "store", "include", "metadata", "reasoning", "truncation", "user", "service_tier", "prompt_cache_key",
    "safety_identifier", "top_logprobs", "stream_options", "background", "max_tool_calls", "prompt_cache_retention",
}  # fmt: skip
"""Request fields with no bearing on sampling from a local model: accepted and left out."""


def _refuse(message: str) -> RequestRefused:
    return RequestRefused(400, message)


def _text_of(content: Any, where: str) -> str:
    """The text of a message's content: a string, or text parts (input_text, output_text, text)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _refuse(f"{where}: 'content' must be a string or a list of text parts")
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text", "text") or not isinstance(part.get("text"), str):
            raise _refuse(f"{where}: content part of type {kind!r} is not supported (text parts only)")
        texts.append(part["text"])
    return "".join(texts)


def messages_from_input(items: Any) -> Thread:  # noqa: C901 - over the limit when the rule came on; split it when next changed
    """Chat messages from a Responses `input` (a string or a list of items); an assistant message and the
    function calls after it become one assistant turn, as the model sampled them."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise _refuse("'input' must be a string or a list of input items")
    messages: Thread = []
    for index, item in enumerate(items):
        where = f"input[{index}]"
        if not isinstance(item, dict):
            raise _refuse(f"{where} must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise _refuse(f"{where}: role {role!r} is not one of user, system, developer, assistant")
            messages.append(
                {"role": "system" if role == "developer" else role, "content": _text_of(item.get("content"), where)}
            )
        elif kind == "function_call":
            call = {
                "id": item.get("call_id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments") or "{}"},
            }
            if not isinstance(call["id"], str) or not isinstance(item.get("name"), str):
                raise _refuse(f"{where}: a function_call item needs 'call_id' and 'name'")
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
                if last["content"] == "":
                    last["content"] = None
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            if not isinstance(item.get("call_id"), str):
                raise _refuse(f"{where}: a function_call_output item needs 'call_id'")
            text = output if isinstance(output, str) else _text_of(output, where)
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": text})
        elif kind == "reasoning":
            continue  # the packaged models do not reason in a separate channel; nothing to render
        else:
            raise _refuse(
                f"{where}: input items of type {kind!r} are not supported "
                "(message, function_call, function_call_output and reasoning are)"
            )
    return messages


def _chat_tools(tools: Any) -> list[dict[str, Any]] | None:
    if not tools:
        return None
    chat_tools = []
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("name"), str):
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            raise _refuse(f"tools[{index}] is of type {kind!r}: only function tools run on a local model")
        # Keys in the order vLLM renders them, so the prompt the engine renders is the one a re-rendering gives.
        function: dict[str, Any] = {"name": tool["name"]}
        if tool.get("description"):
            function["description"] = tool["description"]
        function["parameters"] = tool.get("parameters") or {"type": "object", "properties": {}}
        chat_tools.append({"type": "function", "function": function})
    return chat_tools


def _chat_tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    raise _refuse(f"tool_choice {choice!r} is not supported: use auto, none, required or a function")


def chat_request(body: dict[str, Any], thread_of: Callable[[str], Thread | None]) -> tuple[dict[str, Any], Thread]:  # noqa: C901 - over the limit when the rule came on; split it when next changed
    """The chat-completions body for a Responses request, and its conversation without `instructions`
    (what a later response continues). `thread_of` finds the thread of a `previous_response_id`."""
    unknown = set(body) - IGNORED_FIELDS - {
        "model", "input", "instructions", "previous_response_id", "tools", "tool_choice", "parallel_tool_calls",
        "max_output_tokens", "temperature", "top_p", "stream", "text",
    }  # fmt: skip
    if unknown:
        raise _refuse(f"Responses fields not supported by the gateway: {sorted(unknown)}")
    if body.get("background"):
        raise _refuse("background responses are not supported: send the request and wait for it")
    thread: Thread = []
    if (previous := body.get("previous_response_id")) is not None:
        found = thread_of(str(previous))
        if found is None:
            raise RequestRefused(
                404,
                f"previous_response_id {previous!r} names no response this gateway answered (or it was evicted): "
                "send the whole conversation as `input` instead",
            )
        thread = [dict(m) for m in found]
    thread += messages_from_input(body.get("input", []))
    instructions = body.get("instructions")
    messages = ([{"role": "system", "content": instructions}] if instructions else []) + thread
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    for source, target in (("temperature", "temperature"), ("top_p", "top_p"), ("max_output_tokens", "max_tokens")):
        if body.get(source) is not None:
            chat[target] = body[source]
    if tools := _chat_tools(body.get("tools")):
        chat["tools"] = tools
        if body.get("tool_choice") is not None:
            chat["tool_choice"] = _chat_tool_choice(body["tool_choice"])
        if body.get("parallel_tool_calls") is not None:
            chat["parallel_tool_calls"] = body["parallel_tool_calls"]
    text_format = (body.get("text") or {}).get("format") or {}
    if text_format.get("type") == "json_schema":
        chat["response_format"] = {
            "type": "json_schema",
            "json_schema": {k: text_format[k] for k in ("name", "schema", "strict") if k in text_format},
        }
    elif text_format.get("type") == "json_object":
        chat["response_format"] = {"type": "json_object"}
    if body.get("stream"):
        chat["stream"] = True
    return chat, thread


def new_response_id() -> str:
    return f"resp_{uuid.uuid4().hex}"


def _tool_call_items(message: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function_call",
            "id": f"fc_{call.get('id') or uuid.uuid4().hex}",
            "call_id": call.get("id"),
            "name": call["function"]["name"],
            "arguments": call["function"]["arguments"],
            "status": "completed",
        }
        for call in message.get("tool_calls") or []
    ]


def message_item(item_id: str, text: str, logprobs: list[dict[str, Any]], status: str) -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": [part]}


def response_object(
    body: dict[str, Any], response_id: str, chat_answer: dict[str, Any], *, status: str = "completed"
) -> dict[str, Any]:
    """The Responses object for a chat completion's first choice, with the gateway's stamps."""
    choice = (chat_answer.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    logprobs = [
        {"token": e.get("token", ""), "logprob": e["logprob"], "bytes": e.get("bytes") or [], "top_logprobs": []}
        for e in ((choice.get("logprobs") or {}).get("content") or [])
    ]
    output = []
    if message.get("content") or not message.get("tool_calls"):
        output.append(message_item(f"msg_{response_id[5:]}", message.get("content") or "", logprobs, "completed"))
    output += _tool_call_items(message)
    truncated = choice.get("finish_reason") == "length"
    usage = chat_answer.get("usage") or {}
    response = {
        "id": response_id,
        "object": "response",
        "created_at": chat_answer.get("created") or int(time.time()),
        "model": chat_answer.get("model") or body.get("model"),
        "status": "incomplete" if truncated and status == "completed" else status,
        "incomplete_details": {"reason": "max_output_tokens"} if truncated else None,
        "error": None,
        "instructions": body.get("instructions"),
        "previous_response_id": body.get("previous_response_id"),
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "max_output_tokens": body.get("max_output_tokens"),
        "metadata": body.get("metadata") or {},
        "text": body.get("text") or {"format": {"type": "text"}},
        "usage": {
            "input_tokens": usage.get("prompt_tokens", 0),
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": usage.get("completion_tokens", 0),
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.get("total_tokens", 0),
        },
    }
    return stamped(response, choice)


def choice_fields(response: dict[str, Any]) -> dict[str, Any]:
    """A chat Choice's fields from a Responses object (text joined, function calls as tool calls, the
    gateway's stamps kept): how a trajectory holds a response."""
    texts, tool_calls = [], []
    for item in response.get("output") or []:
        if item.get("type") == "message":
            texts += [part.get("text") or "" for part in item.get("content") or [] if part.get("type") == "output_text"]
        elif item.get("type") == "function_call":
            tool_calls.append(
                {
                    "id": item["call_id"],
                    "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]},
                }
            )
    truncated = (response.get("incomplete_details") or {}).get("reason") == "max_output_tokens"
    return chat_choice(texts, tool_calls, "length" if truncated else ("tool_calls" if tool_calls else "stop"), response)


def thread_after(thread: Thread, chat_answer: dict[str, Any]) -> Thread:
    """The conversation a later `previous_response_id` continues: this one plus the answer's assistant turn."""
    message = ((chat_answer.get("choices") or [{}])[0]).get("message") or {}
    turn: dict[str, Any] = {"role": "assistant", "content": message.get("content") or None}
    if message.get("tool_calls"):  # content None beside tool calls, "" without: as the response's items read back
        turn["tool_calls"] = [{k: c[k] for k in ("id", "type", "function") if k in c} for c in message["tool_calls"]]
    elif turn["content"] is None:
        turn["content"] = ""
    return [*thread, turn]


class ResponseThreads:
    """The conversations of recent responses by id, for `previous_response_id`: oldest out first beyond
    `max_responses` threads or `max_bytes` of their JSON, so a client's long threads cannot grow the gateway's
    (the trainer's) memory without bound. A thread larger than the whole bound is not kept (a warning says so)."""

    def __init__(self, max_responses: int = 20_000, max_bytes: int = 256 * 1024 * 1024) -> None:
        self.max_responses = max_responses
        self.max_bytes = max_bytes
        self._by_id: OrderedDict[str, tuple[Thread, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def num_bytes(self) -> int:
        """The kept threads' size, as JSON."""
        return self._bytes

    def put(self, response_id: str, thread: Thread) -> None:
        size = len(json.dumps(thread, separators=(",", ":")))
        if size > self.max_bytes:
            logger.warning("response %s's thread is %d bytes, over the gateway's bound (%d): a follow-up naming it as "
                           "previous_response_id will be refused", response_id, size, self.max_bytes)  # fmt: skip
            return
        with self._lock:
            if (previous := self._by_id.pop(response_id, None)) is not None:
                self._bytes -= previous[1]
            self._by_id[response_id] = (thread, size)
            self._bytes += size
            while len(self._by_id) > self.max_responses or self._bytes > self.max_bytes:
                self._bytes -= self._by_id.popitem(last=False)[1][1]

    def get(self, response_id: str) -> Thread | None:
        with self._lock:
            kept = self._by_id.get(response_id)
        return None if kept is None else kept[0]
