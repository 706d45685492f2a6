"""`agentrl backend replica --join`: an inference replica on this host for a head's backend on another.

The agent asks the head's gateway what to serve (/replicas/settings), starts a vLLM server that listens
where the head reaches it, serves a few routes of its own for the head (an adapter pushed with its
checksum, its health, leave), and offers both at /replicas/join. When the head stops asking after it
(the head stopped, restarted, or dropped it) it unloads the head's adapters and offers itself again, so
a head that comes back finds it. It ends when its vLLM server dies or it is interrupted.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import shutil
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from agentrl.backend.serving.remote_replica import HEARTBEAT_S, SILENCE_S, unpack_adapter
from agentrl.backend.serving.server import VLLMServer
from agentrl.foundation.config import ServerConfig
from agentrl.foundation.errors import ConfigurationError, ServerError
from agentrl.gateway.upstream import ReplicaOffer
from agentrl_vllm.server_guard import digest_matches, presented_digest

logger = logging.getLogger(__name__)


def head_url(join: str) -> str:
    """The head gateway's root from `--join` ("HOST:PORT" or "http://HOST:PORT")."""
    url = join if "://" in join else f"http://{join}"
    parts = urlsplit(url)
    if not parts.hostname or not parts.port:
        raise ConfigurationError(
            f"--join {join!r} is not HOST:PORT or http://HOST:PORT: give the head gateway's address"
        )
    return f"{parts.scheme}://{parts.netloc}"


def address_toward(url: str) -> str:
    """This host's address on the route to `url`'s host (what the head reaches this host at)."""
    parts = urlsplit(url)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((parts.hostname or "127.0.0.1", parts.port or 80))  # UDP: nothing is sent
        address: str = probe.getsockname()[0]
        return address


@dataclass
class ReplicaAgent:
    """The agent's state: its server, the head's adapters it holds, and when the head last asked after it."""

    server: VLLMServer
    folder: Path
    key: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    adapters: dict[str, Path] = field(default_factory=dict)
    joined: bool = False
    last_asked: float = 0.0

    def __post_init__(self) -> None:
        self.key_digest = hashlib.sha256(self.key.encode()).digest()  # once, not on every request the head sends

    def routes(self) -> list[Route]:
        return [
            Route("/health", self.health),
            Route("/adapters", self.put_adapter, methods=["PUT"]),
            Route("/adapters", self.delete_adapter, methods=["DELETE"]),
            Route("/leave", self.leave, methods=["POST"]),
        ]

    def refused(self, request: Request) -> Response | None:
        if digest_matches(presented_digest(request.scope), self.key_digest):
            return None
        return PlainTextResponse("Unauthorized: only the head this replica joined may call it", status_code=401)

    async def health(self, request: Request) -> Response:
        if (refusal := self.refused(request)) is not None:
            return refusal
        self.last_asked = time.monotonic()
        if (notice := self.server.death_notice()) is not None:
            return PlainTextResponse(notice, status_code=503)
        return JSONResponse({"adapters": sorted(self.adapters)})

    async def put_adapter(self, request: Request) -> Response:
        if (refusal := self.refused(request)) is not None:
            return refusal
        name = request.query_params.get("name", "")
        folder = self.folder / "adapters" / hashlib.sha256(name.encode()).hexdigest()[:24]
        data = await request.body()
        try:
            await asyncio.to_thread(unpack_adapter, data, request.headers.get("x-sha256", ""), folder)
        except ServerError as error:
            shutil.rmtree(folder, ignore_errors=True)
            return PlainTextResponse(str(error), status_code=400)
        if name in self.adapters:  # a push repeated after a failure: vLLM refuses a name already loaded
            await self.server.unload_adapter(name)
        try:
            await self.server.load_adapter(name, folder)
        except ServerError as error:
            self.adapters.pop(name, None)
            return PlainTextResponse(str(error), status_code=502)
        self.adapters[name] = folder
        logger.info("serving %s (%d bytes, SHA-256 checked)", name, len(data))
        return JSONResponse({"name": name, "bytes": len(data)})

    async def delete_adapter(self, request: Request) -> Response:
        if (refusal := self.refused(request)) is not None:
            return refusal
        name = request.query_params.get("name", "")
        if (folder := self.adapters.pop(name, None)) is not None:
            await self.server.unload_adapter(name)
            shutil.rmtree(folder, ignore_errors=True)
        return JSONResponse({"name": name})

    async def leave(self, request: Request) -> Response:
        if (refusal := self.refused(request)) is not None:
            return refusal
        await self.drop_adapters("the head let this replica go")
        return JSONResponse({"left": True})

    async def drop_adapters(self, why: str) -> None:
        """Unload every adapter of the head and wait to join again."""
        logger.info("%s: unloading %d adapter(s), then offering this replica again", why, len(self.adapters))
        self.joined = False
        for name, folder in list(self.adapters.items()):
            await self.server.unload_adapter(name)
            shutil.rmtree(folder, ignore_errors=True)
        self.adapters.clear()


async def _settings(client: httpx.AsyncClient, head: str, wait_s: float) -> dict[str, object]:
    """The head's /replicas/settings, retried while the head is unreachable or has no model yet."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            answer = await client.get(f"{head}/replicas/settings")
            if answer.status_code == 200:
                settings: dict[str, object] = answer.json()
                return settings
            if answer.status_code in (401, 404):
                raise ConfigurationError(
                    f"the head at {head} said {answer.status_code}: {answer.json()['error']['message']}"
                )
            why = answer.text[:300]
        except httpx.TransportError as error:
            why = f"{type(error).__name__}: {error}"
        if time.monotonic() > deadline:
            raise ServerError(f"the head at {head} gave no settings within {wait_s:.0f} s ({why}); is it serving?")
        await asyncio.sleep(HEARTBEAT_S)


async def serve_replica(
    join: str, token: str, *, folder: Path, model: str | None = None, host: str | None = None, port: int = 0,
    wait_s: float = 600.0,
) -> None:  # fmt: skip
    """Run the agent and its vLLM server until the server dies (a `ServerError` with its log) or it is cancelled."""
    head = head_url(join)
    host = host or address_toward(head)
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=600.0) as client:
        settings = await _settings(client, head, wait_s)
        model_path = model or str(settings["model"])
        if not Path(model_path).exists():
            raise ConfigurationError(f"the head's base model folder {model_path} is not on this host: pass --model")
        config = ServerConfig.model_validate(settings["server"]).model_copy(update={"replicas": 1})
        server = VLLMServer(
            model_path, folder / "vllm.log", config, max_lora_rank=int(str(settings["max_lora_rank"])), host=host
        )
        await server.start(str(settings["served_name"]))
        agent = ReplicaAgent(server, folder)
        web = uvicorn.Server(
            uvicorn.Config(Starlette(routes=agent.routes()), host=host, port=port, log_level="warning")
        )
        serving = asyncio.create_task(web.serve())
        try:
            while not web.started:
                await asyncio.sleep(0.05)
            agent_port = web.servers[0].sockets[0].getsockname()[1]
            offer = ReplicaOffer(server_url=server.root_url, server_key=server.api_key,
                                 agent_url=f"http://{host}:{agent_port}", agent_key=agent.key, host=socket.gethostname())  # fmt: skip
            await _keep_joined(agent, client, head, offer)
        finally:
            web.should_exit = True
            await asyncio.gather(serving, return_exceptions=True)
            await asyncio.to_thread(server.stop)


async def _keep_joined(agent: ReplicaAgent, client: httpx.AsyncClient, head: str, offer: ReplicaOffer) -> None:
    """Offer the replica until the head takes it; offer it again when the head stops asking after it."""
    while (notice := agent.server.death_notice()) is None:
        if not agent.joined:
            try:
                answer = await client.post(f"{head}/replicas/join", content=offer.model_dump_json())
                if answer.status_code == 200:
                    agent.joined, agent.last_asked = True, time.monotonic()
                    logger.info("joined the head at %s as %s", head, answer.json()["track"])
                else:
                    logger.warning("the head at %s did not take this replica yet: %s", head, answer.text[:300])
            except httpx.TransportError as error:
                logger.warning("cannot reach the head at %s (%s); trying again", head, error)
        elif time.monotonic() - agent.last_asked > SILENCE_S:
            await agent.drop_adapters(f"the head at {head} has not asked after this replica for {SILENCE_S:.0f} s")
        await asyncio.sleep(HEARTBEAT_S)
    raise ServerError(notice)
