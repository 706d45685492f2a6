"""A stand-in for vLLM's OpenAI server at the HTTP boundary, for the gateway's and replicas' security tests.

It speaks the parts of vLLM's protocol those tests need: chat completions whose id is built from the
request's `request_id` (as vLLM builds it), with `token_ids` and logprobs; LoRA load/unload that refuse a
name already loaded or unknown, as vLLM does. It records every body it receives, can answer slowly
(polling for the client's disconnect, as vLLM's `with_cancellation` does) and can fail loads on demand.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


@dataclass
class FakeVLLM:
    """A vLLM-like server on a free loopback port, in its own thread."""

    delay_s: float = 0.0
    """How long a completion takes; the server gives up as soon as the client disconnects."""
    fail_loads: bool = False
    received: list[dict[str, Any]] = field(default_factory=list)
    loaded: set[str] = field(default_factory=set)
    aborted: int = 0
    """Completions abandoned because the client disconnected before the answer."""
    finished: int = 0
    port: int = 0
    cut_streams_after: int | None = None
    """With a number, a streamed completion sends that many of its three tokens and then the server dies mid-stream
    (the connection breaks without the stream's end), as a replica that crashed would."""

    def app(self) -> Starlette:
        async def chat(request: Request) -> Response:
            body = await request.json()
            self.received.append(body)
            if body.get("stream"):
                return StreamingResponse(self.stream(body), media_type="text/event-stream")
            return await self.answer(request, body)

        async def load(request: Request) -> JSONResponse:
            name = (await request.json())["lora_name"]
            if self.fail_loads:
                return JSONResponse({"error": "cannot load"}, status_code=500)
            if name in self.loaded:
                return JSONResponse({"error": f"The lora adapter '{name}' has already been loaded."}, status_code=400)
            self.loaded.add(name)
            return JSONResponse("ok")

        async def unload(request: Request) -> JSONResponse:
            name = (await request.json())["lora_name"]
            if name not in self.loaded:
                return JSONResponse({"error": f"The lora adapter '{name}' cannot be found."}, status_code=404)
            self.loaded.discard(name)
            return JSONResponse("ok")

        async def models(request: Request) -> JSONResponse:
            return JSONResponse({"object": "list", "data": [{"id": name} for name in sorted(self.loaded)]})

        return Starlette(
            routes=[
                Route("/v1/chat/completions", chat, methods=["POST"]),
                Route("/v1/load_lora_adapter", load, methods=["POST"]),
                Route("/v1/unload_lora_adapter", unload, methods=["POST"]),
                Route("/v1/models", models),
            ]
        )

    async def answer(self, request: Request, body: dict[str, Any]) -> JSONResponse:
        """A whole completion, after `delay_s` (given up as soon as the client disconnects)."""
        deadline = time.monotonic() + self.delay_s
        while time.monotonic() < deadline:
            if await request.is_disconnected():
                self.aborted += 1
                return JSONResponse({}, status_code=499)
            await asyncio.sleep(0.02)
        self.finished += 1
        n = body.get("n") or 1
        choices = [
            {
                "index": i,
                "message": {"role": "assistant", "content": "ok"},
                "finish_reason": "stop",
                "token_ids": [10 + i, 11],
                "logprobs": {"content": [{"token": "t", "logprob": -0.5, "bytes": None, "top_logprobs": []}] * 2},
            }
            for i in range(n)
        ]
        return JSONResponse(
            {
                "id": f"chatcmpl-{body.get('request_id', 'none')}",
                "object": "chat.completion",
                "created": 0,
                "model": body.get("model"),
                "prompt_token_ids": [1, 2, 3],
                "choices": choices,
            }
        )

    async def stream(self, body: dict[str, Any]) -> AsyncIterator[str]:
        """Three chunks of one token each (vLLM's fields: token ids, logprobs, the prompt's ids first), then [DONE]."""
        for index in range(3):
            if index == self.cut_streams_after:
                raise ConnectionAbortedError("the replica died mid-stream")
            choice = {
                "index": 0,
                "delta": {"role": "assistant", "content": f"t{index} "},
                "token_ids": [20 + index],
                "logprobs": {"content": [{"token": f"t{index}", "logprob": -0.1, "bytes": None, "top_logprobs": []}]},
                "finish_reason": "stop" if index == 2 else None,
            }
            chunk = {"id": f"chatcmpl-{body.get('request_id', 'none')}", "object": "chat.completion.chunk",
                     "created": 0, "model": body.get("model"), "choices": [choice]}  # fmt: skip
            if index == 0:
                chunk["prompt_token_ids"] = [1, 2, 3]
            yield f"data: {json.dumps(chunk)}\n\n"
            await asyncio.sleep(0.01)
        self.finished += 1
        yield "data: [DONE]\n\n"

    def __enter__(self) -> FakeVLLM:
        self._server = uvicorn.Server(uvicorn.Config(self.app(), host="127.0.0.1", port=0, log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            assert time.monotonic() < deadline, "the fake vLLM server did not start"
            time.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"
