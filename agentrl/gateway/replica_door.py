"""Where inference replicas on other hosts join the gateway (`agentrl backend replica --join`).

An agent next to a vLLM server on another host asks /replicas/settings what to serve (the base model and
the server's settings), starts its server, then offers it at /replicas/join; the backend loads every
adapter it serves into the new replica (pushed over HTTP, checked by checksum) before the gateway sends
it a request. Both routes need the join token (AGENTRL_JOIN_TOKEN), which opens nothing else; the
gateway's other tokens do not open them.
"""

from __future__ import annotations

import asyncio
import hashlib

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from agentrl.foundation.errors import AgentRLError
from agentrl.gateway.auth import JOIN_PREFIX
from agentrl.gateway.error_answers import gateway_error
from agentrl.gateway.upstream import ReplicaDoor, ReplicaOffer, Upstream
from agentrl_vllm.server_guard import digest_matches, presented_digest


class _JoinRoutes:
    """The two join routes over `upstream`; without a join token they answer 404 with how to open them."""

    def __init__(self, upstream: Upstream, join_token: str | None) -> None:
        self.upstream = upstream
        self.digest = hashlib.sha256(join_token.encode()).digest() if join_token else None

    def door(self, request: Request) -> ReplicaDoor | JSONResponse:
        """The backend's servers, or the answer that refuses this request (no join token, a wrong one, no servers)."""
        if self.digest is None:
            return gateway_error(
                404,
                "this backend takes no inference replicas from other hosts: start it with AGENTRL_JOIN_TOKEN set "
                "(LocalBackend(join_token=...))",
            )
        if not digest_matches(presented_digest(request.scope), self.digest):
            return gateway_error(
                401, "the head refused this replica's token: set AGENTRL_JOIN_TOKEN to the head's join token"
            )
        if self.upstream.door is None:
            return gateway_error(503, "the backend has no servers yet (no model registered); try again shortly")
        return self.upstream.door

    async def settings(self, request: Request) -> JSONResponse:
        door = self.door(request)
        return door if isinstance(door, JSONResponse) else JSONResponse(door.settings())

    async def join(self, request: Request) -> JSONResponse:
        door = self.door(request)
        if isinstance(door, JSONResponse):
            return door
        try:
            offer = ReplicaOffer.model_validate_json(await request.body())
        except ValidationError as error:
            return gateway_error(400, f"not a replica offer: {error}")
        try:
            replica = await asyncio.wrap_future(door.admit(offer))
        except AgentRLError as error:
            return gateway_error(502, f"the head could not take this replica: {error}")
        self.upstream.replicas.append(replica)
        return JSONResponse({"track": replica.track, "replicas": len(self.upstream.in_rotation())})


def replica_routes(upstream: Upstream, join_token: str | None) -> list[Route]:
    """/replicas/settings and /replicas/join over `upstream`, opened by `join_token` alone."""
    routes = _JoinRoutes(upstream, join_token)
    return [
        Route(JOIN_PREFIX + "settings", routes.settings),
        Route(JOIN_PREFIX + "join", routes.join, methods=["POST"]),
    ]
