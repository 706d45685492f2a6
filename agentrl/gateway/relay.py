"""Streamed answers passed through to the client as they come, their token data kept in the store before
the stream ends (so a client that trains at once finds it): chat chunks as they are, or told as another
API's events (Responses, Anthropic Messages)."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import httpx

from agentrl.foundation.sampled_record import SampledRecord
from agentrl.gateway.chunks import StreamedAnswer
from agentrl.gateway.store import SampledStore, StreamAccumulator

if TYPE_CHECKING:
    from agentrl.gateway.messages_api import MessageEvents
    from agentrl.gateway.responses_stream import ResponseEvents
    from agentrl.gateway.upstream import Replica

logger = logging.getLogger(__name__)

OnAnswer = Callable[[dict[str, Any], dict[str, Any]], None]
"""Told each answer (request body, answer with the gateway's stamps) of a rollout session."""


def cut_message(error: Exception) -> str:
    """What a client is told when its stream's server went away mid-answer."""
    return (
        f"the inference server's stream broke off mid-answer ({type(error).__name__}: {error}); the answer is "
        "incomplete and is not kept for training: retry the request"
    )


def chat_error_event(message: str) -> bytes:
    """A chat completion stream's error event (the openai client raises `APIError` on it)."""
    error = {"message": message, "type": "server_error", "code": "stream_cut"}
    return f"data: {json.dumps({'error': error}, separators=(',', ':'))}\n\n".encode()


async def relay_chat(
    upstream: httpx.Response,
    store: SampledStore,
    replica: Replica,
    joined: tuple[dict[str, Any], OnAnswer] | None = None,
    rollout: str | None = None,
) -> AsyncIterator[bytes]:
    """Pass the server-sent events through as they come, and keep the token data once the stream ends.

    The data is kept before the final `[DONE]` goes out: a client that reads it and trains at once
    must find its completion in the store (seen in the suite: storing after the last byte raced it).
    """
    accumulated, kept, answer = StreamAccumulator(), False, StreamedAnswer()
    try:
        async for line in upstream.aiter_lines():
            if line == "data: [DONE]" and accumulated.completion_id is not None:
                store.put(accumulated.completion_id, accumulated.choices(), rollout)
                kept = True
                if joined is not None:  # a session's stream: logged, like a whole answer, before [DONE] goes out
                    joined[1](joined[0], answer.answer())
            elif line.startswith("data: "):
                chunk = json.loads(line[len("data: ") :])
                accumulated.add(chunk)
                record = SampledRecord(completion_id=accumulated.completion_id, policy_step=accumulated.policy_step)
                for choice in chunk.get("choices") or []:  # as on a whole answer: the lookup id and the adapter step
                    choice.update(record.stamps())
                answer.add(chunk)
                line = "data: " + json.dumps(chunk, separators=(",", ":"))
            yield (line + "\n").encode()
    except httpx.TransportError as error:  # the server went away mid-stream: say so, instead of a bare hang-up
        logger.warning("a streamed chat completion broke off: %s: %s", type(error).__name__, error)
        yield chat_error_event(cut_message(error))
    finally:
        await upstream.aclose()
        replica.request_done()
        if not kept and accumulated.completion_id is not None:
            store.put(accumulated.completion_id, accumulated.choices(), rollout)


async def relay_as(  # noqa: C901 - over the limit when the rule came on; split it when next changed
    upstream: httpx.Response,
    store: SampledStore,
    replica: Replica,
    answer_id: str,
    events: ResponseEvents | MessageEvents,
    answered: Callable[[dict[str, Any]], None],
    rollout: str | None = None,
) -> AsyncIterator[bytes]:
    """A streamed chat completion told as another API's events as its chunks come; its token data is kept
    under `answer_id`, and `answered` is told the joined chat answer, before the closing events go out."""
    accumulated, joined, usage, started, kept = StreamAccumulator(), StreamedAnswer(), None, False, False
    try:
        async for line in upstream.aiter_lines():
            if line == "data: [DONE]":
                sampled = accumulated.choices()
                store.put(answer_id, sampled, rollout)
                kept = True
                chat_answer = joined.answer()
                chat_answer["usage"] = usage
                if sampled:
                    chat_answer["choices"][0].update(SampledRecord(token_ids=sampled[0].token_ids).stamps())
                answered(chat_answer)
                for event in events.finish(chat_answer):
                    yield event
            elif line.startswith("data: "):
                chunk = json.loads(line[len("data: ") :])
                accumulated.add(chunk)
                usage = chunk.get("usage") or usage
                stamps = SampledRecord(completion_id=answer_id, policy_step=accumulated.policy_step).stamps()
                if not started:
                    started = True
                    for event in events.start(chunk.get("model"), stamps):
                        yield event
                for choice in chunk.get("choices") or []:
                    choice.update(stamps)
                joined.add(chunk)
                for event in events.add(chunk):
                    yield event
    except httpx.TransportError as error:  # the server went away mid-stream: the API's own error event
        logger.warning("a streamed answer broke off: %s: %s", type(error).__name__, error)
        yield events.cut(cut_message(error))
    finally:
        await upstream.aclose()
        replica.request_done()
        if not kept and accumulated.completion_id is not None:
            store.put(answer_id, accumulated.choices(), rollout)
