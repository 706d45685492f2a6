"""A streamed chat completion joined back into one answer from its chunks: text and tool calls, and
the gateway's stamps (completion_id, policy_step). Fed raw server-sent-event bytes (a client reading
the stream) or parsed chunks (the gateway relaying it)."""

from __future__ import annotations

import json
from typing import Any

from agentrl.foundation.sampled_record import SampledRecord


class ServerSentEvents:
    """A stream of server-sent events read as it passes: each `data:` line's JSON goes to `add`, and
    `done` turns true at the stream's end (`[DONE]`, or the event a subclass takes for the end)."""

    def __init__(self) -> None:
        self.pending = b""
        self.done = False

    def feed(self, data: bytes) -> bool:
        """Take some bytes of the stream (cut anywhere); True once it has ended."""
        self.pending += data
        *lines, self.pending = self.pending.split(b"\n")
        for line in lines:
            text = line.strip().decode("utf-8", "replace")
            if text == "data: [DONE]":
                self.done = True
            elif text.startswith("data: "):
                try:
                    self.add(json.loads(text[len("data: ") :]))
                except (json.JSONDecodeError, AttributeError, TypeError, KeyError):
                    continue  # not an event of this stream: nothing to join
        return self.done

    def add(self, event: dict[str, Any]) -> None:
        raise NotImplementedError


class StreamedAnswer(ServerSentEvents):
    """A streamed chat completion put back together from its server-sent events, as they pass."""

    def __init__(self) -> None:
        super().__init__()
        self.model = ""
        self.choice: dict[str, Any] = {"index": 0, "finish_reason": None}
        self.content: list[str] = []
        self.tool_calls: dict[int, dict[str, Any]] = {}

    def add(self, chunk: dict[str, Any]) -> None:
        """Take one parsed chunk."""
        self.model = chunk.get("model") or self.model
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue  # the first choice is the one a trajectory keeps, as for a whole answer
            self.choice.update(SampledRecord.naming(choice).stamps())
            if choice.get("finish_reason") is not None:
                self.choice["finish_reason"] = choice["finish_reason"]
            delta = choice.get("delta") or {}
            if delta.get("content"):
                self.content.append(delta["content"])
            for call in delta.get("tool_calls") or []:
                joined = self.tool_calls.setdefault(
                    call.get("index", 0), {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
                )
                joined["id"] = call.get("id") or joined["id"]
                function = call.get("function") or {}
                joined["function"]["name"] += function.get("name") or ""
                joined["function"]["arguments"] += function.get("arguments") or ""

    def answer(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.content) or None}
        if self.tool_calls:
            message["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        return {"model": self.model, "choices": [{**self.choice, "message": message}]}
