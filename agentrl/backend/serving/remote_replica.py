"""An inference replica on another host, as the head's backend drives it (its agent: replica_agent.py).

Nothing on disk is shared: an adapter's served files (weights and peft config, not the optimizer state)
travel to the replica's agent as one tar over HTTP with their SHA-256, which the agent checks before its
vLLM server loads them. The head asks the agent's health every `HEARTBEAT_S`; a replica whose host
refuses the connection, whose server died, or that stays silent for `SILENCE_S` is gone, named with
its host, and leaves the rotation while the others serve on.
"""

from __future__ import annotations

import hashlib
import io
import logging
import tarfile
import threading
import time
from pathlib import Path

import httpx

from agentrl.foundation.errors import ServerError
from agentrl.gateway.upstream import Replica, ReplicaOffer

logger = logging.getLogger(__name__)

SERVED_PREFIX = "adapter_"
"""What vLLM reads of a checkpoint, peft's files (adapter_model.safetensors, adapter_config.json): the rest (the
optimizer's state) stays on the head."""
HEARTBEAT_S = 2.0
SILENCE_S = 30.0
"""A replica that answers no health check for this long is gone (a frozen host, a cut network)."""
PUSH_TIMEOUT = httpx.Timeout(120.0, connect=10.0)


def pack_adapter(folder: Path) -> bytes:
    """The adapter's served files in `folder` as one uncompressed tar (the weights do not compress)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in sorted(folder.glob(f"{SERVED_PREFIX}*")):
            tar.add(path, arcname=path.name)
    return buffer.getvalue()


def unpack_adapter(data: bytes, sha256: str, folder: Path) -> None:
    """Check `data` against the sender's `sha256`, then write its files into `folder` (nothing written on a
    mismatch: a torn or altered push is refused, never served)."""
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise ServerError(f"the adapter arrived with SHA-256 {digest}, the head sent {sha256}: refused, push it again")
    folder.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        names = tar.getnames()
        if not names or any("/" in name or not name.startswith(SERVED_PREFIX) for name in names):
            raise ServerError(f"an adapter push holds {names}, not only peft's {SERVED_PREFIX}* files")
        tar.extractall(folder, filter="data")


class RemoteReplica:
    """A vLLM server on another host behind its agent: adapters pushed over HTTP, liveness from its health."""

    gpu = False
    """Its memory is its host's: it never sleeps for the head's trainer."""

    def __init__(self, offer: ReplicaOffer, track: str) -> None:
        self.offer, self.track = offer, track
        self.notice: str | None = None
        self.last_answer = time.monotonic()
        self.pushed_bytes = 0
        """Bytes of the last adapter pushed (measured for the scaling table, docs/scaling.md)."""
        self.push_s = 0.0
        self._agent = {"Authorization": f"Bearer {offer.agent_key}"}
        self._stopping = threading.Event()
        self._watch = threading.Thread(target=self._heartbeat, name=f"agentrl-{track}", daemon=True)
        self._watch.start()

    def gateway_replica(self) -> Replica:
        """How the gateway reaches its server, asking its agent on a transport error."""
        return Replica(self.offer.server_url, self.offer.server_key, self.death_notice, self.track, probe=self.check)

    def check(self) -> str | None:
        """Ask its agent now; returns (and keeps) why it is gone, or None while it answers."""
        if self.notice is not None or self._stopping.is_set():
            return self.notice
        where = f"the inference replica on host {self.offer.host} ({self.offer.agent_url})"
        try:
            answer = httpx.get(f"{self.offer.agent_url}/health", headers=self._agent, timeout=HEARTBEAT_S * 2)
        except httpx.ConnectError as error:
            self.notice = f"{where} refused the connection: {error}"
        except httpx.TransportError as error:
            silent_s = time.monotonic() - self.last_answer
            if silent_s > SILENCE_S:
                self.notice = f"{where} answered nothing for {silent_s:.0f} s ({type(error).__name__})"
        else:
            self.last_answer = time.monotonic()
            if answer.status_code != 200:
                self.notice = f"{where}: {answer.text[:2000]}"
        if self.notice is not None:
            logger.warning("%s", self.notice)
        return self.notice

    def _heartbeat(self) -> None:
        while not self._stopping.wait(HEARTBEAT_S) and self.check() is None:
            pass

    def death_notice(self) -> str | None:
        return self.notice

    def recent_log(self) -> str:
        return f"{self.track}: its vLLM log is on host {self.offer.host}"

    async def _call(self, method: str, path: str, **kwargs: object) -> httpx.Response:
        if self.notice is not None:
            raise ServerError(self.notice)
        async with httpx.AsyncClient(timeout=PUSH_TIMEOUT, headers=self._agent) as client:
            answer = await client.request(method, f"{self.offer.agent_url}{path}", **kwargs)  # type: ignore[arg-type]
        if answer.status_code != 200:
            raise ServerError(f"{method} {path} on {self.track} failed with {answer.status_code}: {answer.text[:500]}")
        return answer

    async def load_adapter(self, name: str, path: Path) -> None:
        """Push the adapter's served files to the agent, which checks their checksum and loads them as `name`."""
        started = time.perf_counter()
        data = pack_adapter(path)
        sha256 = hashlib.sha256(data).hexdigest()
        await self._call("PUT", "/adapters", params={"name": name}, content=data, headers={"x-sha256": sha256})
        self.pushed_bytes, self.push_s = len(data), time.perf_counter() - started

    async def unload_adapter(self, name: str) -> None:
        await self._call("DELETE", "/adapters", params={"name": name})

    async def sleep(self, level: int = 1) -> None:
        """Nothing: it does not share a device with the head's trainer."""

    async def wake_up(self) -> None:
        """Nothing (see `sleep`)."""

    def stop(self) -> None:
        """Stop watching it and tell its agent to drop this head's adapters (it then waits to join again)."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        if self.notice is None:
            try:
                httpx.post(f"{self.offer.agent_url}/leave", headers=self._agent, timeout=10.0)
            except httpx.TransportError as error:
                logger.warning("could not tell %s to leave: %s", self.track, error)
