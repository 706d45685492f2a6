"""Automatic trajectory capture: every chat completion, Responses answer or Anthropic message an agent gets
from agentrl's gateway, whatever client or framework asks, recorded into the current trajectory (a
Responses or Messages exchange as the chat completion the gateway sampled for it).

    with agentrl.capture_trajectory() as trajectory:
        answer = await my_langgraph_agent.ainvoke({"messages": [("user", question)]})
    trajectory.reward = score(answer)

Recording happens in httpx and httpx2 (which the `openai` client, litellm and LangChain use), in the
task or thread that entered the context; concurrent rollouts each capture their own. A completion
counts when the gateway answered it from a trained adapter ("name@step": its choices carry the
gateway's `completion_id` and `policy_step`), so judge calls to other endpoints and calls to the
untrained "base" model stay out (`model=` narrows it to one model), and the trainer later takes the
exact sampled tokens from the gateway by that id. Nothing is recorded after the block ends, even from
tasks it started that are still running. A call on a thread that did not inherit the block's context
(`run_in_executor`, a plain thread) is recorded when exactly one capture is open, and otherwise
skipped with a warning. A streamed completion is recorded when its stream ends (`data: [DONE]`), from
the chunks as the client reads them: text and tool calls joined, the gateway's stamps kept.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import json
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from openai.types.chat.chat_completion import Choice

from agentrl.data.trajectory import History, Trajectory
from agentrl.foundation.sampled_record import SampledRecord, served_by
from agentrl.gateway.client_apis import ClientApi, api_for_path
from agentrl.gateway.limits import RequestRefused
from agentrl.gateway.upstream import UPSTREAM_HEADER

if TYPE_CHECKING:
    pass


class _Named(Protocol):
    """Anything with a name (a `Model`): `capture_trajectory(model=...)` keeps that model's completions."""

    @property
    def name(self) -> str: ...


logger = logging.getLogger(__name__)


@dataclass
class _Capture:
    """One open `capture_trajectory` block."""

    trajectory: Trajectory
    model_name: str | None
    every_endpoint: bool = False
    """Record every chat completion, whatever endpoint answered (ART's `capture_auto_trajectory`)."""
    open: bool = True
    threads: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """The conversations of the Responses answers captured so far, for a later `previous_response_id`."""


_current: contextvars.ContextVar[_Capture | None] = contextvars.ContextVar("agentrl_captured", default=None)
_open_by_id: dict[int, _Capture] = {}
_open_lock = threading.Lock()
_installed: set[str] = set()


@contextlib.contextmanager
def capture_trajectory(
    trajectory: Trajectory | None = None, *, model: _Named | str | None = None, every_endpoint: bool = False
) -> Iterator[Trajectory]:
    """Record every completion a trained adapter answers through agentrl's gateway inside the block into
    `trajectory` (a new one by default), turn by turn: a call that continues the conversation extends it,
    any other call starts an additional history. `model` (a model or its name) records only that model's
    completions. With `every_endpoint`, every chat completion is recorded, whatever answered it (as ART's
    capture does); one from elsewhere carries no sampled tokens, so training on it needs
    `allow_training_without_logprobs` and otherwise fails naming it. Set the reward after the block."""
    _install_hooks()
    name = model if isinstance(model, str) or model is None else model.name
    capture = _Capture(trajectory if trajectory is not None else Trajectory(), name, every_endpoint)
    token = _current.set(capture)
    with _open_lock:
        _open_by_id[id(capture)] = capture
    try:
        yield capture.trajectory
    finally:
        capture.open = False
        with _open_lock:
            _open_by_id.pop(id(capture), None)
        _current.reset(token)


@contextlib.contextmanager
def no_capture() -> Iterator[None]:
    """Record none of this block's calls, even inside a capture (a judge's or a tool's own model calls); a capture
    opened inside the block records as usual."""
    token = _current.set(_Capture(Trajectory(), None, open=False))
    try:
        yield
    finally:
        _current.reset(token)


def current_trajectory() -> Trajectory | None:
    """The trajectory being captured in this task or thread, or None outside `capture_trajectory`."""
    capture = _current.get()
    return capture.trajectory if capture is not None and capture.open else None


def _capture_here() -> _Capture | None:
    """The open capture this call belongs to: its context's, or on a thread without one, the only open capture."""
    capture = _current.get()
    if capture is not None:
        return capture if capture.open else None
    with _open_lock:
        if not _open_by_id:
            return None
        if len(_open_by_id) == 1:
            return next(iter(_open_by_id.values()))
    _warn_unattributed()
    return None


@functools.cache
def _warn_unattributed() -> None:
    logger.warning(
        "a chat completion made on a thread outside every capture's context was not captured: several captures are "
        "open, and it cannot say whose it is. Run it with asyncio.to_thread or contextvars.copy_context().run"
    )


def record_completion(trajectory: Trajectory, request: dict[str, Any], response: dict[str, Any]) -> None:
    """Add one chat completion (the request's messages and the response's first choice) to `trajectory`."""
    choices = response.get("choices") or []
    if not choices:
        return
    choice = Choice.model_validate(choices[0])
    messages = [dict(m) for m in request.get("messages") or []]
    tools = request.get("tools") or None
    histories = trajectory.histories()  # the main conversation first, then the additional ones
    for index in reversed(range(len(histories))):  # the most recent conversation this call continues
        history = histories[index]
        sent = [_comparable(m) for m in history.messages()]
        if history.messages_and_choices and (history.tools or None) == tools:
            if [_comparable(m) for m in messages[: len(sent)]] == sent:
                _set_history(trajectory, index, [*history.messages_and_choices, *messages[len(sent) :], choice], tools)
                return
    if not trajectory.messages_and_choices:
        _set_history(trajectory, 0, [*messages, choice], tools)
    else:
        _set_history(trajectory, len(histories), [*messages, choice], tools)


def _set_history(trajectory: Trajectory, index: int, items: list[Any], tools: list[dict[str, Any]] | None) -> None:
    """Replace conversation `index` (0: the main one; len(histories): a new additional one)."""
    if index == 0:
        trajectory.messages_and_choices, trajectory.tools = items, tools
        return
    extra = list(trajectory.additional_histories)
    history = History(messages_and_choices=items, tools=tools)
    if index - 1 < len(extra):
        extra[index - 1] = history
    else:
        extra.append(history)
    trajectory.additional_histories = extra


def _comparable(message: dict[str, Any]) -> tuple[Any, ...]:
    """What identifies a message when a framework sends the conversation back (it may add or drop empty fields)."""
    calls = tuple(
        (call.get("function", {}).get("name"), _arguments(call.get("function", {}).get("arguments")))
        for call in message.get("tool_calls") or []
    )
    return message.get("role"), message.get("content") or "", calls, message.get("tool_call_id")


def _arguments(arguments: Any) -> Any:
    try:
        return json.dumps(json.loads(arguments), sort_keys=True) if isinstance(arguments, str) else arguments
    except json.JSONDecodeError:
        return arguments


def _completion_request(request: Any) -> tuple[ClientApi, dict[str, Any]] | None:
    """The client API and JSON body of a sampling request (an httpx or httpx2 request), or None for any other."""
    api = api_for_path(request.url.path)
    if request.method != "POST" or api is None:
        return None
    try:
        body = json.loads(request.content or b"{}")
    except Exception:  # noqa: BLE001 - a body that is not read or not JSON is not a completion to record
        return None
    return (api, body) if isinstance(body, dict) else None


def _observe(capture: _Capture, api: ClientApi, body: dict[str, Any], response: Any) -> None:
    if not capture.open or response.status_code != 200:
        return
    try:
        answer = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return
    if isinstance(answer, dict):
        _observe_answer(capture, api, body, answer)


def _install_hooks() -> None:
    """Wrap the send of httpx's and httpx2's clients (async and sync) once per process; the wrappers do
    nothing while no capture is open."""
    for library in ("httpx", "httpx2"):
        if library in _installed:
            continue
        try:
            module = importlib.import_module(library)
        except ImportError:
            continue
        _wrap_sends(module)
        _installed.add(library)


def _to_record(request: Any) -> tuple[_Capture, ClientApi, dict[str, Any]] | None:
    """The open capture, API and request body when this request's answer should be recorded, else None
    (cheap while no capture is open)."""
    if not _open_by_id or request.headers.get(UPSTREAM_HEADER):  # the gateway forwarding to vLLM: not a client
        return None
    sampling = _completion_request(request)
    capture = _capture_here() if sampling is not None else None
    if capture is None or sampling is None:
        return None
    return capture, *sampling


def capture_counts(answer: dict[str, Any], model_name: str | None, every_endpoint: bool = False) -> bool:
    """Whether an answer is recorded: agentrl's gateway answered it from a trained adapter (the base model
    and other endpoints stay out; with `every_endpoint` any answer with choices), of `model_name` when given."""
    choices = answer.get("choices") or []
    gateway = any(SampledRecord.naming(c).from_gateway for c in choices)
    if not (gateway or (every_endpoint and choices)):
        return False
    return model_name is None or served_by(answer.get("model"), model_name)


def _observe_answer(capture: _Capture, api: ClientApi, body: dict[str, Any], answer: dict[str, Any]) -> None:
    if not capture.open:
        return
    exchange = _as_chat(capture, api, body, answer)
    if exchange is not None and capture_counts(exchange[1], capture.model_name, capture.every_endpoint):
        record_completion(capture.trajectory, *exchange)


def _as_chat(
    capture: _Capture, api: ClientApi, body: dict[str, Any], answer: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """A Responses or Messages exchange as the chat completion the gateway sampled for it (the same
    translation), or None for an answer that is not one."""
    translation = api.translation
    if translation is None:
        return body, answer
    if not api.is_answer(answer):
        return None
    try:
        chat_body, thread = translation.chat_request(body, capture.threads.get)
    except RequestRefused as refused:
        logger.warning("a %s answer was not captured: %s", api.name, refused.message)
        return None
    chat_answer = {"model": answer.get("model"), "choices": [translation.choice_fields(answer)]}
    if translation.thread_after is not None:
        capture.threads[str(answer.get("id"))] = translation.thread_after(thread, chat_answer)
    return chat_body, chat_answer


def _tee_stream(module: Any, response: Any, capture: _Capture, api: ClientApi, body: dict[str, Any]) -> None:
    """Let the client read `response`'s stream as usual, and record the answer when it ends."""
    streamed = api.reader()

    def chunk_seen(data: bytes) -> None:
        if not streamed.done and streamed.feed(data):
            _observe_answer(capture, api, body, streamed.answer())

    response.stream = _teed(module, response.stream, chunk_seen)


def _teed(module: Any, inner: Any, chunk_seen: Callable[[bytes], None]) -> Any:
    """`inner` (an httpx byte stream, async or not) read as before, each chunk shown to `chunk_seen` on its way."""
    if isinstance(inner, module.AsyncByteStream):

        class AsyncTee(module.AsyncByteStream):  # type: ignore[misc]
            async def __aiter__(self) -> Any:
                async for data in inner:
                    chunk_seen(data)
                    yield data

            async def aclose(self) -> None:
                await inner.aclose()

        return AsyncTee()
    if isinstance(inner, module.SyncByteStream):

        class SyncTee(module.SyncByteStream):  # type: ignore[misc]
            def __iter__(self) -> Any:
                for data in inner:
                    chunk_seen(data)
                    yield data

            def close(self) -> None:
                inner.close()

        return SyncTee()
    return inner


def _wrap_sends(module: Any) -> None:
    async_send, sync_send = module.AsyncClient.send, module.Client.send

    async def send_async(self: Any, request: Any, **kwargs: Any) -> Any:
        response = await async_send(self, request, **kwargs)
        if (recording := _to_record(request)) is not None:
            if recording[2].get("stream"):
                if response.status_code == 200:
                    _tee_stream(module, response, *recording)
            else:
                await response.aread()  # kept by the client: the caller still reads it as usual
                _observe(*recording, response)
        return response

    def send_sync(self: Any, request: Any, **kwargs: Any) -> Any:
        response = sync_send(self, request, **kwargs)
        if (recording := _to_record(request)) is not None:
            if recording[2].get("stream"):
                if response.status_code == 200:
                    _tee_stream(module, response, *recording)
            else:
                response.read()
                _observe(*recording, response)
        return response

    module.AsyncClient.send = send_async
    module.Client.send = send_sync
