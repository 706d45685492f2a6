"""Rollout sessions: a URL prefix (/v1/sessions/{id}/) under which every chat completion the gateway
answers is logged for one rollout, so an agent program that only knows a base URL is trained.

Ids are random (128 bits) and a session takes requests only while open: a request on a closed or
unknown session is refused with 404, never recorded elsewhere. Thread-safe (the gateway serves on
its own thread; the rollout opens and closes sessions on its event loop).
"""

from __future__ import annotations

import secrets
import threading
from typing import Any

Exchange = tuple[dict[str, Any], dict[str, Any]]
"""One chat completion: the request body and the answer (the gateway's stamps on its choices)."""


class SessionLog:
    """The open sessions and the completions logged under each."""

    def __init__(self) -> None:
        self._open: dict[str, list[Exchange]] = {}
        self._lock = threading.Lock()

    def open(self) -> str:
        session_id = secrets.token_hex(16)
        with self._lock:
            self._open[session_id] = []
        return session_id

    def is_open(self, session_id: str) -> bool:
        with self._lock:
            return session_id in self._open

    def record(self, session_id: str, request: dict[str, Any], answer: dict[str, Any]) -> bool:
        """Log one completion; False when the session closed meanwhile (then nothing is kept)."""
        with self._lock:
            log = self._open.get(session_id)
            if log is None:
                return False
            log.append((request, answer))
            return True

    def close(self, session_id: str) -> list[Exchange]:
        """End the session and return what it logged, in the order the answers came."""
        with self._lock:
            return self._open.pop(session_id, [])
