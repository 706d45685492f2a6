"""The gateway's ASGI app: OpenAI-compatible routes in front of one vLLM server, nothing else.

Every chat or text completion is forwarded with `logprobs` and `return_token_ids` switched on,
whatever the client sent, and what was sampled is kept by completion id (`SampledStore`). The
response goes back unchanged, extra fields included, so clients that keep them (openai, raw HTTP)
carry the exact tokens in their Choices, and the rest can be looked up by id at /v1/sampled/{id}.
vLLM's admin routes (LoRA loading, sleep, collective_rpc) have no route here: they are unreachable.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from agentrl.backend.server_guard import BearerGuard
from agentrl.errors import TokenizationError
from agentrl.gateway.store import SampledStore, StreamAccumulator, sampled_choices

UPSTREAM_TIMEOUT = httpx.Timeout(None, connect=30.0)  # generations take as long as they take; clients set their own


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "gateway_error", "code": status}}, status_code=status)


def create_gateway_app(
    upstream_url: str,
    upstream_key: str,
    store: SampledStore,
    *,
    token: str | None = None,
    death_notice: Callable[[], str | None] | None = None,
) -> Any:
    """The ASGI app: routes /v1/chat/completions, /v1/completions, /v1/models, /v1/sampled/{id}, /health.

    `upstream_url` is the vLLM root ("http://127.0.0.1:PORT"); with `token`, every route but /health
    needs it as a bearer token. `death_notice` says what happened to a server that stopped answering.
    """
    clients: dict[str, httpx.AsyncClient] = {}

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        clients["upstream"] = httpx.AsyncClient(
            base_url=upstream_url,
            headers={"Authorization": f"Bearer {upstream_key}"},
            timeout=UPSTREAM_TIMEOUT,
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=256),
        )
        yield
        await clients.pop("upstream").aclose()

    def unreachable(error: Exception) -> JSONResponse:
        notice = death_notice() if death_notice is not None else None
        return _error(503, notice or f"the inference server did not answer: {type(error).__name__}: {error}")

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "sampled_completions_kept": len(store)})

    async def models(request: Request) -> Response:
        try:
            upstream = await clients["upstream"].get("/v1/models")
        except httpx.TransportError as error:
            return unreachable(error)
        return Response(upstream.content, status_code=upstream.status_code, media_type="application/json")

    async def completions(request: Request) -> Response:
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return _error(400, "the request body is not JSON")
        if not isinstance(body, dict):
            return _error(400, "the request body must be a JSON object")
        chat = request.url.path.endswith("/chat/completions")
        body.setdefault("logprobs", True if chat else 1)
        body["return_token_ids"] = True
        upstream_request = clients["upstream"].build_request("POST", request.url.path, json=body)
        try:
            upstream = await clients["upstream"].send(upstream_request, stream=bool(body.get("stream")))
        except httpx.TransportError as error:
            return unreachable(error)
        if not body.get("stream"):
            if upstream.status_code != 200:
                return Response(upstream.content, status_code=upstream.status_code, media_type="application/json")
            data = upstream.json()
            store.put(data["id"], sampled_choices(data))
            for choice in data.get("choices") or []:
                choice["completion_id"] = data["id"]  # for the trainer's lookup when a client drops the token data
            return JSONResponse(data)
        if upstream.status_code != 200:
            content = await upstream.aread()
            await upstream.aclose()
            return Response(content, status_code=upstream.status_code, media_type="application/json")
        return StreamingResponse(_relay(upstream, store), media_type="text/event-stream")

    async def sampled(request: Request) -> Response:
        try:
            choices = store.get(request.path_params["completion_id"])
        except TokenizationError as error:
            return _error(404, str(error))
        return JSONResponse([c.model_dump() for c in choices])

    app = Starlette(
        routes=[
            Route("/health", health),
            Route("/v1/models", models),
            Route("/v1/chat/completions", completions, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/sampled/{completion_id:path}", sampled),
        ],
        lifespan=lifespan,
    )
    return BearerGuard(app, token) if token else app


async def _relay(upstream: httpx.Response, store: SampledStore) -> AsyncIterator[bytes]:
    """Pass the server-sent events through as they come, and keep the token data once the stream ends.

    The data is kept before the final `[DONE]` goes out: a client that reads it and trains at once
    must find its completion in the store (seen in the suite: storing after the last byte raced it).
    """
    accumulated, kept = StreamAccumulator(), False
    try:
        async for line in upstream.aiter_lines():
            if line == "data: [DONE]" and accumulated.completion_id is not None:
                store.put(accumulated.completion_id, accumulated.choices())
                kept = True
            elif line.startswith("data: "):
                accumulated.add(json.loads(line[len("data: ") :]))
            yield (line + "\n").encode()
    finally:
        await upstream.aclose()
        if not kept and accumulated.completion_id is not None:
            store.put(accumulated.completion_id, accumulated.choices())
