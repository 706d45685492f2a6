"""Running the gateway: a uvicorn server on its own thread and event loop, started and stopped by the backend.

Its own loop, not the caller's: a notebook cell or a rollout that blocks (a synchronous `openai.OpenAI`
client, `requests`, `time.sleep`) would otherwise stall the very gateway it is waiting on. On its
own thread, uvicorn leaves the process's signal handlers alone, so Ctrl-C still stops the whole run.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import threading
from collections.abc import Sequence

import uvicorn
from starlette.routing import BaseRoute

from agentrl.foundation.errors import ConfigurationError, ServerError
from agentrl.foundation.secret_tokens import check_token_strength
from agentrl.gateway.app import create_gateway_app
from agentrl.gateway.limits import GatewayLimits
from agentrl.gateway.sessions import SessionLog
from agentrl.gateway.store import SampledStore
from agentrl.gateway.upstream import Replica, ReplicaDoor, Upstream


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


class Gateway:
    """The OpenAI-compatible door to a backend's vLLM server; keeps what it sampled for the trainer.

    It can listen before the server exists (a remote backend takes requests before any model is
    registered); `connect` points it at the server once there is one.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        admin_token: str | None = None,
        store: SampledStore | None = None,
        routes: Sequence[BaseRoute] = (),
        limits: GatewayLimits | None = None,
        join_token: str | None = None,
    ) -> None:
        """`token` opens sampling (/v1); `admin_token` also opens `routes` (/backend/); see `gateway.auth`.
        `join_token` opens /replicas/ alone, where inference replicas on other hosts join (replica_door.py)."""
        if not token and not is_loopback(host):
            raise ConfigurationError(
                f"the gateway would listen on {host}, beyond loopback, without a token; set one "
                "(AGENTRL_TOKEN) or listen on 127.0.0.1"
            )
        if routes and not admin_token:
            raise ConfigurationError("a gateway with backend routes needs an admin token for them")
        if join_token is not None:  # a replica that joins receives every adapter and prompt
            check_token_strength(join_token, "the join token (AGENTRL_JOIN_TOKEN, LocalBackend(join_token=...))")
        self.host, self.port, self.token = host, port, token
        self.store = store or SampledStore()
        self.upstream = Upstream(limits=limits or GatewayLimits())
        self.sessions = SessionLog()
        app = create_gateway_app(
            self.upstream,
            self.store,
            token=token,
            admin_token=admin_token,
            routes=routes,
            sessions=self.sessions,
            join_token=join_token,
        )
        self._server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on"))
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None

    def connect(
        self,
        replicas: Sequence[Replica],
        *,
        drop_seed: bool = False,
        context: int | None = None,
        door: ReplicaDoor | None = None,
    ) -> None:
        """Forward completions to these vLLM servers (replicas of one model, `context` tokens long), balanced by
        requests in flight; replicas from other hosts join through `door`."""
        self.upstream.door = door
        self.upstream.drop_seed = drop_seed
        self.upstream.context = context
        self.upstream.replicas = list(replicas)

    @property
    def started(self) -> bool:
        return self._thread is not None

    @property
    def root_url(self) -> str:
        """Where it listens, e.g. "http://127.0.0.1:PORT" (a wildcard host is reached on loopback)."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible root, e.g. "http://127.0.0.1:PORT/v1"."""
        return f"{self.root_url}/v1"

    async def start(self) -> None:
        """Listen (on a free port when none was given) and serve on the gateway's thread."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._serve, name="agentrl-gateway", daemon=True)
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                self._thread = None
                raise ServerError(
                    f"the gateway could not listen on {self.host}:{self.port} ({self._failure!r}); "
                    "choose another port, or free this one"
                )
            await asyncio.sleep(0.02)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]

    def _serve(self) -> None:
        try:
            asyncio.run(self._server.serve())
        except BaseException as error:  # noqa: BLE001 - uvicorn exits with SystemExit when it cannot bind
            self._failure = error

    async def stop(self) -> None:
        """Stop listening; requests in flight finish first."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._server.should_exit = True
            await asyncio.to_thread(thread.join)
