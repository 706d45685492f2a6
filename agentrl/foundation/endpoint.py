"""Where a backend serves a model: all a model needs to sample (the gateway's address, its token, and
how to tell that the server behind it died)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class InferenceEndpoint:
    """Where a backend serves a model's current adapter, and how to talk to it."""

    base_url: str
    """OpenAI-compatible root, e.g. "http://127.0.0.1:8000/v1"."""
    api_key: str = field(repr=False)
    """Bearer token the gateway requires (never shown in a repr)."""
    death_notice: Callable[[], str | None] | None = None
    """None while the server runs, else what happened to it (exit, log tail); None when unknowable."""
    recent_log: Callable[[], str] | None = None
    """The server's latest log lines (its queue and throughput): what a hung or overloaded server was doing."""
