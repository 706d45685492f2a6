"""Running the gateway: a uvicorn server on this process's event loop, started and stopped by the backend."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
from collections.abc import Callable, Generator
from typing import Any

import uvicorn

from agentrl.errors import ConfigurationError
from agentrl.gateway.app import create_gateway_app
from agentrl.gateway.store import SampledStore


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


class _QuietServer(uvicorn.Server):
    """uvicorn without its signal handlers: it runs inside a training process, whose Ctrl-C must stop the
    whole run (uvicorn's own handlers would swallow it and stop only the gateway)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class Gateway:
    """The OpenAI-compatible door to one vLLM server; keeps what it sampled for the trainer."""

    def __init__(
        self,
        upstream_url: str,
        upstream_key: str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        death_notice: Callable[[], str | None] | None = None,
        store: SampledStore | None = None,
    ) -> None:
        if not token and not is_loopback(host):
            raise ConfigurationError(
                f"the gateway would listen on {host}, beyond loopback, without a token; set one "
                "(AGENTRL_TOKEN) or listen on 127.0.0.1"
            )
        self.host, self.port, self.token = host, port, token
        self.store = store or SampledStore()
        app = create_gateway_app(upstream_url, upstream_key, self.store, token=token, death_notice=death_notice)
        self._server = _QuietServer(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on"))
        self._task: asyncio.Task[Any] | None = None

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible root, e.g. "http://127.0.0.1:PORT/v1"."""
        return f"http://{self.host}:{self.port}/v1"

    async def start(self) -> None:
        """Listen (on a free port when none was given) and serve in the background."""
        self._task = asyncio.ensure_future(self._server.serve())
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises why it could not start (e.g. the port is taken)
            await asyncio.sleep(0.02)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._task is not None:
            self._server.should_exit = True
            await self._task
            self._task = None
