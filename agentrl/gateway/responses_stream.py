"""The Responses API's event streams: a streamed chat completion told as Responses server-sent events
(`ResponseEvents`, what the gateway sends), and the final response read back from such a stream
(`CompletedResponse`, how trajectory capture reads one)."""

from __future__ import annotations

import json
import uuid
from typing import Any

from agentrl.gateway.chunks import ServerSentEvents
from agentrl.gateway.responses_api import message_item, response_object


class CompletedResponse(ServerSentEvents):
    """The final Responses object of a Responses event stream (its `response.completed` or
    `response.incomplete` event), fed raw bytes: how capture reads a streamed response."""

    def __init__(self) -> None:
        super().__init__()
        self.response: dict[str, Any] = {}

    def add(self, event: dict[str, Any]) -> None:
        if event.get("type") in ("response.completed", "response.incomplete"):
            self.response, self.done = event.get("response") or {}, True

    def answer(self) -> dict[str, Any]:
        return self.response


class ResponseEvents:
    """A streamed chat completion told as Responses server-sent events, chunk by chunk."""

    def __init__(self, body: dict[str, Any], response_id: str) -> None:
        self.body, self.response_id = body, response_id
        self.sequence = 0
        self.text_item: str | None = None
        self.text: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}  # chat tool-call index -> its output item
        self.next_output = 0
        self.text_output = 0

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()

    def cut(self, message: str) -> bytes:
        """The error event that ends a stream whose server went away (the openai client raises `APIError`)."""
        return self._event("error", code="stream_cut", message=message, param=None,
                           error={"type": "server_error", "code": "stream_cut", "message": message})  # fmt: skip

    def start(self, model: str | None, stamps: dict[str, Any]) -> list[bytes]:
        """The opening events: the response, in progress, with no output yet."""
        answer: dict[str, Any] = {"choices": [], "model": model}
        shell = {**response_object(self.body, self.response_id, answer, status="in_progress"), **stamps}
        shell["output"], shell["usage"] = [], None
        return [self._event("response.created", response=shell), self._event("response.in_progress", response=shell)]

    def add(self, chunk: dict[str, Any]) -> list[bytes]:
        events = []
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if delta.get("content"):
                if self.text_item is None:
                    self.text_item, self.text_output = f"msg_{self.response_id[5:]}", self.next_output
                    self.next_output += 1
                    events.append(
                        self._event(
                            "response.output_item.added",
                            output_index=self.text_output,
                            item={**message_item(self.text_item, "", [], "in_progress"), "content": []},
                        )
                    )
                    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                    events.append(
                        self._event(
                            "response.content_part.added",
                            item_id=self.text_item,
                            output_index=self.text_output,
                            content_index=0,
                            part=part,
                        )
                    )
                self.text.append(delta["content"])
                events.append(
                    self._event(
                        "response.output_text.delta",
                        item_id=self.text_item,
                        output_index=self.text_output,
                        content_index=0,
                        delta=delta["content"],
                        logprobs=[],
                    )
                )
            for call in delta.get("tool_calls") or []:
                events += self._call_delta(call)
        return events

    def _call_delta(self, call: dict[str, Any]) -> list[bytes]:
        index, function = call.get("index", 0), call.get("function") or {}
        item = self.calls.get(index)
        events = []
        if item is None:
            call_id = call.get("id") or f"call_{uuid.uuid4().hex}"
            item = {
                "type": "function_call",
                "id": f"fc_{call_id}",
                "call_id": call_id,
                "name": function.get("name") or "",
                "arguments": "",
                "status": "in_progress",
                "output_index": self.next_output,
            }
            self.calls[index] = item
            self.next_output += 1
            events.append(
                self._event("response.output_item.added", output_index=item["output_index"], item=self._public(item))
            )
        if function.get("arguments"):
            item["arguments"] += function["arguments"]
            events.append(
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=item["output_index"],
                    delta=function["arguments"],
                )
            )
        return events

    @staticmethod
    def _public(item: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in item.items() if k != "output_index"}

    def finish(self, chat_answer: dict[str, Any]) -> list[bytes]:
        """The closing events, from the whole answer joined from the stream (the gateway's stamps on it)."""
        events = []
        final = response_object(self.body, self.response_id, chat_answer)
        if self.text_item is not None:
            text = "".join(self.text)
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            where = {"item_id": self.text_item, "output_index": self.text_output, "content_index": 0}
            events.append(self._event("response.output_text.done", **where, text=text, logprobs=[]))
            events.append(self._event("response.content_part.done", **where, part=part))
            item = message_item(self.text_item, text, [], "completed")
            events.append(self._event("response.output_item.done", output_index=self.text_output, item=item))
        for item in self.calls.values():
            item["status"] = "completed"
            events.append(
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=item["output_index"],
                    name=item["name"],
                    arguments=item["arguments"],
                )
            )
            events.append(
                self._event("response.output_item.done", output_index=item["output_index"], item=self._public(item))
            )
        # The final object lists the items in the order the stream announced them.
        streamed = [(self.text_output, o) for o in final["output"] if o["type"] == "message" and self.text_item]
        streamed += [(item["output_index"], self._public(item)) for item in self.calls.values()]
        final["output"] = [o for _, o in sorted(streamed, key=lambda pair: pair[0])] or final["output"]
        kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
        events.append(self._event(kind, response=final))
        return events
