"""Automatic trajectory capture: every chat completion an agent makes through agentrl's gateway, whatever
client or framework makes it, recorded into the current trajectory.

    with agentrl.capture_trajectory() as trajectory:
        answer = await my_langgraph_agent.ainvoke({"messages": [("user", question)]})
    trajectory.reward = score(answer)

Recording happens in httpx (which the `openai` client, litellm and LangChain use), in the task or thread
that entered the context; concurrent rollouts each capture their own. A completion counts when the
gateway answered it (its choices carry the gateway's `completion_id`), so judge calls to other
endpoints stay out, and the trainer later takes the exact sampled tokens from the gateway by that id.
Streamed completions are not captured (a warning says so): ask for non-streamed ones inside a capture.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
from collections.abc import Iterator
from typing import Any

import httpx
from openai.types.chat.chat_completion import Choice

from agentrl.trajectory import History, Trajectory

logger = logging.getLogger(__name__)

_current: contextvars.ContextVar[Trajectory | None] = contextvars.ContextVar("agentrl_captured", default=None)
_installed = False


@contextlib.contextmanager
def capture_trajectory(trajectory: Trajectory | None = None) -> Iterator[Trajectory]:
    """Record every completion made through agentrl's gateway inside the block into `trajectory` (a new one
    by default), turn by turn: a call that continues the conversation extends it, any other call starts an
    additional history. Set its reward after the block."""
    _install_hooks()
    target = trajectory if trajectory is not None else Trajectory()
    token = _current.set(target)
    try:
        yield target
    finally:
        _current.reset(token)


def current_trajectory() -> Trajectory | None:
    """The trajectory being captured in this task or thread, or None outside `capture_trajectory`."""
    return _current.get()


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


def _completion_request(request: httpx.Request) -> dict[str, Any] | None:
    """The JSON body of a chat-completions request, or None for any other request."""
    if request.method != "POST" or not request.url.path.endswith("/chat/completions"):
        return None
    try:
        body = json.loads(request.content or b"{}")
    except (httpx.RequestNotRead, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return body if isinstance(body, dict) else None


def _observe(body: dict[str, Any], response: httpx.Response) -> None:
    trajectory = _current.get()
    if trajectory is None or response.status_code != 200:
        return
    try:
        answer = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return
    if isinstance(answer, dict) and any(c.get("completion_id") for c in answer.get("choices") or []):
        record_completion(trajectory, body, answer)  # answered by agentrl's gateway


def _install_hooks() -> None:
    """Wrap httpx's send (async and sync) once per process; the wrappers do nothing outside a capture."""
    global _installed
    if _installed:
        return
    async_send, sync_send = httpx.AsyncClient.send, httpx.Client.send

    async def send_async(self: httpx.AsyncClient, request: httpx.Request, **kwargs: Any) -> httpx.Response:
        response = await async_send(self, request, **kwargs)
        body = _completion_request(request) if _current.get() is not None else None
        if body is not None and not _streamed(body):
            await response.aread()  # kept by httpx: the caller still reads it as usual
            _observe(body, response)
        return response

    def send_sync(self: httpx.Client, request: httpx.Request, **kwargs: Any) -> httpx.Response:
        response = sync_send(self, request, **kwargs)
        body = _completion_request(request) if _current.get() is not None else None
        if body is not None and not _streamed(body):
            response.read()
            _observe(body, response)
        return response

    httpx.AsyncClient.send = send_async  # type: ignore[method-assign]
    httpx.Client.send = send_sync  # type: ignore[method-assign]
    _installed = True


def _streamed(body: dict[str, Any]) -> bool:
    if body.get("stream"):
        logger.warning("a streamed chat completion was not captured into the trajectory; ask for non-streamed ones")
        return True
    return False
