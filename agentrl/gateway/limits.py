"""What one client may ask of the gateway: body size, choices, tokens, logprobs, requests in flight.

The gateway lives in the process that holds the trainer, so a request that makes it buffer or
generate without bound (a 64 MiB body, `n=100000`, `max_tokens=1e12`) would take the trainer down
with it. Each bound is refused with a 4xx that names the field, its value and the limit.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import ClientDisconnect, Request

MiB = 1024 * 1024


class GatewayLimits(BaseModel):
    """Bounds on what a client may ask of a backend's gateway (`LocalBackend(limits=...)`, `agentrl backend serve`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_body_bytes: int = Field(default=16 * MiB, gt=0)
    """Largest sampling request (/v1/...) body; a long agent history with tool schemas is well under 1 MiB."""
    max_backend_body_bytes: int = Field(default=256 * MiB, gt=0)
    """Largest /backend/ request body (a train request carries every trajectory of a step with its tokens)."""
    max_n: int = Field(default=64, gt=0)
    """Most choices one completion request may ask for (`n`, `best_of`)."""
    max_top_logprobs: int = Field(default=20, ge=0)
    """Most alternatives per token (`top_logprobs`, `logprobs` of text completions, `prompt_logprobs`)."""
    max_tokens: int | None = Field(default=None, gt=0)
    """Most tokens one choice may generate; None: the served model's context (`ServerConfig.max_model_len`)."""
    max_in_flight_per_replica: int = Field(default=256, gt=0)
    """Requests one vLLM server works on at once; beyond that (on every replica) a request gets 429, to retry."""
    body_timeout_s: float = Field(default=30.0, gt=0)
    """Longest wait for the next piece of a request's body; a client that sends nothing longer gets 408 and is let
    go (a slow or stalled sender would otherwise hold its connection, and its buffer, for as long as it liked)."""


class RequestRefused(Exception):
    """A request the gateway will not forward: its status and a message naming the field and the limit."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


CLIENT_GONE = 499
"""The status of a request whose client hung up before its body arrived (nobody reads the answer)."""


async def read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The request's body, refused (413) once it passes `limit` bytes, before the rest is read; 408 when no piece
    of it arrives for `timeout_s`; `CLIENT_GONE` when the client hangs up before it ends (quietly: no traceback)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestRefused(413, f"the request body is {int(declared)} bytes; this gateway takes at most {limit}")
    chunks, size = [], 0
    pieces = request.stream().__aiter__()
    try:
        while True:
            try:
                chunk = await asyncio.wait_for(pieces.__anext__(), timeout_s)
            except StopAsyncIteration:
                break
            size += len(chunk)
            if size > limit:
                raise RequestRefused(413, f"the request body is over {limit} bytes, the most this gateway takes")
            chunks.append(chunk)
    except TimeoutError:
        raise RequestRefused(
            408, f"no part of the request body arrived for {timeout_s:g} s ({size} bytes so far): send it whole"
        ) from None
    except ClientDisconnect:
        raise RequestRefused(CLIENT_GONE, "the client hung up before its request body arrived") from None
    return b"".join(chunks)


def parse_json_object(body: bytes) -> dict[str, Any]:
    """The body as a JSON object; 400 for anything else (not JSON, not UTF-8, nested past the parser's depth)."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as error:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        kind = "nested too deeply" if isinstance(error, RecursionError) else type(error).__name__
        raise RequestRefused(400, f"the request body is not valid JSON in UTF-8 ({kind})") from None
    if not isinstance(data, dict):
        raise RequestRefused(400, "the request body must be a JSON object")
    return data


def _whole_number(body: dict[str, Any], field: str) -> int | None:
    value = body.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestRefused(400, f"`{field}` must be a whole number, got {value!r}")
    return value


def check_sampling_request(body: dict[str, Any], limits: GatewayLimits, *, chat: bool, context: int | None) -> None:
    """Refuse (400) a completion request whose size fields are of the wrong type or past `limits`; `context` is
    the served model's length, the bound on `max_tokens` unless `limits.max_tokens` is set."""
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise RequestRefused(400, f"`stream` must be true or false (a JSON boolean), got {stream!r}")
    for field in ("n", "best_of"):
        value = _whole_number(body, field)
        if value is not None and not 1 <= value <= limits.max_n:
            raise RequestRefused(400, f"`{field}` is {value}; this gateway takes 1 to {limits.max_n}")
    most_tokens = limits.max_tokens or context
    for field in ("max_tokens", "max_completion_tokens"):
        value = _whole_number(body, field)
        if value is not None and (value < 1 or (most_tokens is not None and value > most_tokens)):
            bound = f"1 to {most_tokens} (the served model's context)" if most_tokens else "at least 1"
            raise RequestRefused(400, f"`{field}` is {value}; this gateway takes {bound}")
    alternatives = ["top_logprobs", "prompt_logprobs"] + ([] if chat else ["logprobs"])
    for field in alternatives:
        value = _whole_number(body, field)
        if value is not None and not 0 <= value <= limits.max_top_logprobs:
            raise RequestRefused(400, f"`{field}` is {value}; this gateway takes 0 to {limits.max_top_logprobs}")
    if chat and body.get("logprobs") is not None and not isinstance(body["logprobs"], bool):
        raise RequestRefused(400, f"`logprobs` of a chat completion must be true or false, got {body['logprobs']!r}")
