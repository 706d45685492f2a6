"""Rollout sessions: a URL prefix (/v1/sessions/{id}/) under which every chat completion the gateway
answers is logged for one rollout, so an agent program that only knows a base URL is trained.

Ids are random (128 bits) and a session takes requests only while open: a request on a closed or
unknown session is refused with 404, never recorded elsewhere. Thread-safe (the gateway serves on
its own thread; the rollout opens and closes sessions on its event loop).
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from agentrl.foundation.errors import SessionOverflowError

logger = logging.getLogger(__name__)

Exchange = tuple[dict[str, Any], dict[str, Any]]
"""One chat completion: the request body and the answer (the gateway's stamps on its choices)."""


class SessionLog:
    """The open sessions and the completions logged under each, bounded: at most `max_open` sessions open (opening
    one more drops the oldest, a rollout that never closed its session) and `max_bytes_per_session` of logged JSON in
    one. A session dropped or past its bound logs nothing more, and closing it raises `SessionOverflowError` naming
    the bound, so a rollout never trains on a silently shortened log."""

    def __init__(self, max_open: int = 10_000, max_bytes_per_session: int = 64 * 1024 * 1024) -> None:
        self.max_open = max_open
        self.max_bytes_per_session = max_bytes_per_session
        self._open: OrderedDict[str, _Log] = OrderedDict()
        self._ended: OrderedDict[str, str] = OrderedDict()
        """Why recently dropped or overflowed sessions ended, by id (the newest `max_open`)."""
        self._lock = threading.Lock()

    def open(self) -> str:
        session_id = secrets.token_hex(16)
        with self._lock:
            self._open[session_id] = _Log()
            while len(self._open) > self.max_open:
                dropped, _ = self._open.popitem(last=False)
                self._end(dropped, f"more than {self.max_open} rollout sessions were open at once, and it was the oldest "
                          "(close every session you open: `async with model.session()`)")  # fmt: skip
        return session_id

    def is_open(self, session_id: str) -> bool:
        with self._lock:
            return session_id in self._open

    def record(self, session_id: str, request: dict[str, Any], answer: dict[str, Any]) -> bool:
        """Log one completion; False when the session closed meanwhile or passed its bound (nothing is kept)."""
        size = len(json.dumps(request, separators=(",", ":"))) + len(json.dumps(answer, separators=(",", ":")))
        with self._lock:
            log = self._open.get(session_id)
            if log is None:
                return False
            if log.bytes + size > self.max_bytes_per_session:
                del self._open[session_id]
                self._end(session_id, f"its completions passed {self.max_bytes_per_session} bytes, the most one session "
                          "logs (split the rollout into several sessions)")  # fmt: skip
                return False
            log.exchanges.append((request, answer))
            log.bytes += size
            return True

    def close(self, session_id: str) -> list[Exchange]:
        """End the session and return what it logged, in the order the answers came; `SessionOverflowError`
        for a session that was dropped or passed its bound."""
        with self._lock:
            log = self._open.pop(session_id, None)
            why = self._ended.pop(session_id, None)
        if why is not None:
            raise SessionOverflowError(f"rollout session {session_id[:8]}... logged nothing more after {why}")
        return [] if log is None else log.exchanges

    def _end(self, session_id: str, why: str) -> None:
        logger.warning("rollout session %s... ended: %s", session_id[:8], why)
        self._ended[session_id] = why
        while len(self._ended) > self.max_open:
            self._ended.popitem(last=False)


@dataclass
class _Log:
    exchanges: list[Exchange] = field(default_factory=list)
    bytes: int = 0
