"""ASGI middleware, loaded into the vLLM server by `--middleware`: every route but /health needs the key.

vLLM's own `--api-key` check covers /v1 (and a few other prefixes) only; /sleep, /wake_up,
/collective_rpc and the other dev-mode routes a GPU server needs are left open. This guard closes
them all. Kept free of agentrl's heavy imports: it runs inside the server process.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from typing import Any

SERVER_KEY_ENV = "VLLM_API_KEY"  # vLLM's own variable for --api-key, so its /v1 check uses the same key
OPEN_PATHS = frozenset({"/health"})


class BearerGuard:
    """Answers 401 to any HTTP request without `Authorization: Bearer <key>`, except on `open_paths`.

    The key is compared by its SHA-256 digest in constant time, so neither its length nor its
    prefix leaks through timing.
    """

    def __init__(self, app: Any, key: str, open_paths: frozenset[str] = OPEN_PATHS) -> None:
        if not key:
            raise RuntimeError("a BearerGuard needs a non-empty key")
        self.app = app
        self.key_digest = hashlib.sha256(key.encode()).digest()
        self.open_paths = open_paths

    def _authorized(self, scope: dict[str, Any]) -> bool:
        headers = dict(scope.get("headers") or [])
        scheme, _, token = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        digest = hashlib.sha256(token.encode()).digest()
        return scheme.lower() == "bearer" and hmac.compare_digest(digest, self.key_digest)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket") or scope["path"] in self.open_paths or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = json.dumps({"error": {"message": "Unauthorized: send the key as a bearer token", "code": 401}}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": body})


class RequireServerKey(BearerGuard):
    """The guard vLLM loads with `--middleware`: its key comes from the server's environment."""

    def __init__(self, app: Any) -> None:
        key = os.environ.get(SERVER_KEY_ENV)
        if not key:
            raise RuntimeError(f"{SERVER_KEY_ENV} is not set; the server would be open to every local user")
        super().__init__(app, key)
