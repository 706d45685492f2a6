"""Two tokens for a backend's one port: a sampling token for what rollouts, judges and agent frameworks hold
(/v1/...), and an admin token for what changes a run (/backend/: register, train, log, delete).

A sampling token leaks easily: it sits in every rollout's client, in a judge's litellm parameters,
in an agent framework's environment. With it one can sample and read sampled tokens, never train,
register or write a file. The admin token opens every route.
"""

from __future__ import annotations

import hashlib
from typing import Any

from agentrl_vllm.server_guard import digest_matches, presented_digest, refuse

ADMIN_PREFIX = "/backend/"
JOIN_PREFIX = "/replicas/"
"""Routes that check their own token, the join token of replicas on other hosts (replica_door.py)."""


class TokenGuard:
    """ASGI middleware: /backend/ needs the admin token (403 for the sampling token), every other route either
    token (401 without one). Digests are compared in constant time."""

    def __init__(self, app: Any, *, sampling_token: str, admin_token: str | None = None) -> None:
        if not sampling_token or admin_token == "":
            raise RuntimeError("a TokenGuard needs non-empty tokens")
        self.app = app
        self.sampling_digest = hashlib.sha256(sampling_token.encode()).digest()
        self.admin_digest = hashlib.sha256(admin_token.encode()).digest() if admin_token else None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        if scope["path"].startswith(JOIN_PREFIX):
            await self.app(scope, receive, send)
            return
        presented = presented_digest(scope)
        admin = self.admin_digest is not None and digest_matches(presented, self.admin_digest)
        sampling = digest_matches(presented, self.sampling_digest)
        if scope["path"].startswith(ADMIN_PREFIX):
            if admin:
                await self.app(scope, receive, send)
            elif sampling:
                await refuse(
                    scope,
                    send,
                    403,
                    "this token may sample only; registering, training, logging and deleting checkpoints need the "
                    "backend's admin token (AGENTRL_TOKEN, or backend.token beside the service's runs)",
                )
            else:
                await refuse(scope, send, 401, "Unauthorized: send the backend's admin token as a bearer token")
            return
        if admin or sampling:
            await self.app(scope, receive, send)
            return
        await refuse(scope, send, 401, "Unauthorized: send the backend's sampling or admin token as a bearer token")
