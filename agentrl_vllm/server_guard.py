"""ASGI middleware, loaded into the vLLM server by `--middleware`: every route but /health needs the key.

vLLM's own `--api-key` check covers /v1 (and a few other prefixes) only; /sleep, /wake_up,
/collective_rpc and the other dev-mode routes a GPU server needs are left open. This guard closes
them all. Standard library only, like all of agentrl_vllm: it runs inside the server process.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Mapping
from typing import Any

SERVER_KEY_ENV = "VLLM_API_KEY"  # vLLM's own variable for --api-key, so its /v1 check uses the same key
OPEN_PATHS = frozenset({"/health"})


def presented_digest(scope: Mapping[str, Any]) -> bytes | None:
    """SHA-256 of the request's bearer token (`Authorization: Bearer ...`, or `x-api-key`, where the Anthropic
    SDK sends it; None without either), for constant-time comparison: neither a key's length nor its prefix
    leaks through timing."""
    headers = dict(scope.get("headers") or [])
    scheme, _, token = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
    if scheme.lower() != "bearer" or not token:
        token = headers.get(b"x-api-key", b"").decode("latin-1")
    if not token:
        return None
    return hashlib.sha256(token.encode()).digest()


def digest_matches(presented: bytes | None, key_digest: bytes) -> bool:
    return presented is not None and hmac.compare_digest(presented, key_digest)


async def refuse(scope: dict[str, Any], send: Any, status: int, message: str) -> None:
    """Answer with `status` and a JSON error (a websocket is closed with policy violation)."""
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008})
        return
    body = json.dumps({"error": {"message": message, "code": status}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class BearerGuard:
    """Answers 401 to any HTTP request without `Authorization: Bearer <key>`, except on `open_paths`."""

    def __init__(self, app: Any, key: str, open_paths: frozenset[str] = OPEN_PATHS) -> None:
        if not key:
            raise RuntimeError("a BearerGuard needs a non-empty key")
        self.app = app
        self.key_digest = hashlib.sha256(key.encode()).digest()
        self.open_paths = open_paths

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if (
            scope["type"] not in ("http", "websocket")
            or scope["path"] in self.open_paths
            or digest_matches(presented_digest(scope), self.key_digest)
        ):
            await self.app(scope, receive, send)
            return
        await refuse(scope, send, 401, "Unauthorized: send the key as a bearer token")


class RequireServerKey(BearerGuard):
    """The guard vLLM loads with `--middleware`: its key comes from the server's environment."""

    def __init__(self, app: Any) -> None:
        key = os.environ.get(SERVER_KEY_ENV)
        if not key:
            raise RuntimeError(f"{SERVER_KEY_ENV} is not set; the server would be open to every local user")
        super().__init__(app, key)
