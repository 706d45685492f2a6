"""Trainer ranks on other hosts: the head listens, and a rank on another host joins it with
`agentrl backend rank --join HOST:PORT`.

The head's `TrainerRanks` accepts each joining rank over a connection authenticated with a shared token
(multiprocessing's HMAC challenge), gives it its rank, the torch.distributed rendezvous (a TCP store
that rank 0 keeps on the head) and the trainer's settings, and from then on drives it as a local rank:
the same calls, the same answers. Nothing on disk is shared: a checkpoint a remote rank loads travels
over its connection. A remote rank has no process handle on the head, so its connection is its
liveness: a closed connection is a death, and during a call the rank beats every `HEARTBEAT_S`
seconds, so a call that hears nothing for `SILENCE_S` seconds names the host as gone.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import pickle
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge
from pathlib import Path
from typing import Any

from agentrl.backend.training.ranks.rank_links import SILENCE_S, RemoteRank
from agentrl.foundation.errors import ConfigurationError, TrainingError
from agentrl.foundation.secret_tokens import check_token_strength

logger = logging.getLogger(__name__)

HEARTBEAT_S = 2.0
"""How often a remote rank says it is alive while it works on a call."""


@dataclass(frozen=True)
class JoinPoint:
    """Where trainer ranks from other hosts join this head: the address they reach it at (it listens
    there), the token they must present, and how many of the ranks join from elsewhere."""

    host: str
    port: int
    token: str = field(repr=False)
    remote_ranks: int
    silence_s: float = SILENCE_S
    """How long a call waits without a word from a remote rank before it calls that host gone."""

    def __post_init__(self) -> None:
        check_token_strength(self.token, "the join token (AGENTRL_JOIN_TOKEN)")
        if self.silence_s < 3 * HEARTBEAT_S:
            raise ConfigurationError(
                f"silence_s={self.silence_s} would call a rank gone between two of its heartbeats "
                f"(every {HEARTBEAT_S} s): use {3 * HEARTBEAT_S} s or more"
            )


def rank_join_point(address: str, remote_ranks: int, token: str) -> JoinPoint | None:
    """The join point a command line asks for (None for none), or a ConfigurationError naming what is missing."""
    if not remote_ranks and not address:
        return None
    if not remote_ranks or not address:
        raise ConfigurationError("ranks on other hosts need both --remote-ranks N and --rank-join HOST:PORT")
    if not token:
        raise ConfigurationError("ranks on other hosts need AGENTRL_JOIN_TOKEN set, to the same value on every host")
    host, port = parse_address(address)
    return JoinPoint(host, port, token, remote_ranks)


def launcher_join_address(environ: Mapping[str, str]) -> str:
    """MASTER_ADDR:MASTER_PORT where a launcher (a SkyPilot or Slurm script) set both to the head's join point,
    else "". Under torchrun (TORCHELASTIC_RUN_ID set) they are torchrun's own rendezvous, never the head's."""
    if "TORCHELASTIC_RUN_ID" in environ or not environ.get("MASTER_ADDR") or not environ.get("MASTER_PORT"):
        return ""
    return f"{environ['MASTER_ADDR']}:{environ['MASTER_PORT']}"


def parse_address(text: str) -> tuple[str, int]:
    """HOST:PORT as (host, port); a ConfigurationError naming the expected form otherwise."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigurationError(f"{text!r} is not HOST:PORT (e.g. 10.0.0.5:29400)")
    return host.strip("[]"), int(port)


def is_loopback(host: str) -> bool:
    """Whether `host` names this machine's loopback interface (ranks on "hosts" that are one machine)."""
    if host == "localhost":
        return True
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(host).is_loopback
    return False


@dataclass(frozen=True)
class ShippedFolder:
    """A checkpoint folder's files, sent to a rank that cannot read the head's disk."""

    files: dict[str, bytes]

    @classmethod
    def of(cls, folder: Path) -> ShippedFolder:
        return cls({path.name: path.read_bytes() for path in sorted(Path(folder).iterdir()) if path.is_file()})

    def materialize(self) -> Path:
        """The files in a new temporary folder on this host (the caller removes it)."""
        folder = Path(tempfile.mkdtemp(prefix="agentrl-shipped-"))
        for name, data in self.files.items():
            (folder / name).write_bytes(data)
        return folder


HANDSHAKE_S = 10.0
"""How long one joining connection has to pass the token challenge and say who it is; a silent one is closed."""


def accept_ranks(
    join: JoinPoint, ranks: list[int], world_size: int, rendezvous: str, trainer_args: dict[str, Any], timeout_s: float
) -> list[tuple[Connection, RemoteRank]]:
    """Listen at the join point until a rank has joined for each of `ranks` (in arrival order), and send each
    its welcome: (rank, world size, rendezvous, trainer arguments). Each connection is handled on its own
    thread with `HANDSHAKE_S` to authenticate and say hello, so a port scan, a health check's connect-and-close
    or a silent connection costs nothing but a log line; too few ranks within `timeout_s` is a TrainingError
    that says how long it waited, what it turned away, and how to start the ranks."""
    waiting = _JoinWait(join, ranks, (world_size, rendezvous, trainer_args))
    started = time.monotonic()
    with socket.create_server((join.host, join.port)) as server:
        server.settimeout(0.2)
        while not waiting.done.is_set() and time.monotonic() - started < timeout_s:
            try:
                sock, peer = server.accept()
            except TimeoutError:
                continue
            sock.settimeout(None)
            threading.Thread(target=waiting.handshake, args=(sock, peer), name="agentrl-rank-join", daemon=True).start()
    joined = waiting.close()
    if len(joined) < len(ranks):
        for connection, _ in joined:
            connection.close()
        turned_away = f"; turned away {waiting.refused} connections ({waiting.last_refusal})" if waiting.refused else ""
        raise TrainingError(
            f"waited {time.monotonic() - started:.0f} s for {len(ranks)} trainer ranks to join at {join.host}:"
            f"{join.port}; {len(joined)} joined{turned_away}. On each other host run: agentrl backend rank --join "
            f"{join.host}:{join.port} (with AGENTRL_JOIN_TOKEN set to this head's join token)"
        )
    return joined


class _JoinWait:
    """The connections of one wait for ranks: each authenticated and welcomed on its own thread."""

    def __init__(self, join: JoinPoint, ranks: list[int], welcome: tuple[int, str, dict[str, Any]]) -> None:
        self.join, self.ranks, self.welcome = join, ranks, welcome
        self.joined: list[tuple[Connection, RemoteRank]] = []
        self.refused = 0
        self.last_refusal = ""
        self.done = threading.Event()
        self._lock = threading.Lock()
        self._pending: set[int] = set()

    def handshake(self, sock: socket.socket, peer: Any) -> None:
        """Authenticate one connection (the token's HMAC challenge, both ways) and take its hello, within
        `HANDSHAKE_S`; a rank slot goes to it only then. Any failure closes this connection alone."""
        fd = sock.detach()
        with self._lock:
            self._pending.add(fd)
        timer = threading.Timer(HANDSHAKE_S, _hang_up, args=(fd,))
        timer.start()
        connection = Connection(fd)
        try:
            key = self.join.token.encode()
            deliver_challenge(connection, key)
            answer_challenge(connection, key)
            _, host, pid = connection.recv()
            timer.cancel()
            with self._lock:
                self._pending.discard(fd)
                if self.done.is_set():
                    raise EOFError("every rank had joined already")
                rank = self.ranks[len(self.joined)]
                connection.send((rank, *self.welcome))
                self.joined.append((connection, RemoteRank(str(host), int(pid), self.join.silence_s)))
                if len(self.joined) == len(self.ranks):
                    self.done.set()
            logger.info("trainer rank %d joined from %s (pid %s)", rank, host, pid)
        except Exception as error:  # noqa: BLE001 - whatever a stray or hostile connection does, it ends here
            timer.cancel()
            why = "wrong token" if isinstance(error, AuthenticationError) else f"{type(error).__name__}: {error}"
            with self._lock:
                self._pending.discard(fd)
                self.refused += 1
                self.last_refusal = f"{peer[0]}: {why}"
            connection.close()
            logger.warning("turned away a connection from %s at the rank join point: %s", peer[0], why)

    def close(self) -> list[tuple[Connection, RemoteRank]]:
        """End the wait: hang up every connection still in its handshake; the ranks that joined."""
        with self._lock:
            self.done.set()
            for fd in self._pending:
                _hang_up(fd)
            return list(self.joined)


def _hang_up(fd: int) -> None:
    """Wake a thread blocked reading the socket `fd` (owned by a Connection, which closes it) by shutting it down."""
    with contextlib.suppress(OSError):
        sock = socket.socket(fileno=fd)
        try:
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.detach()


def send_by_value(connection: Connection, message: Any) -> None:
    """Send `message` to another host: by value, where `connection.send` would pass a tensor as a handle to
    this host's shared memory."""
    connection.send_bytes(pickle.dumps(message))


class BeatingConnection:
    """A rank's end of its connection to a head on another host: sends are serialized, and while `working`
    a thread sends a heartbeat every `HEARTBEAT_S`, which the head reads as "still here"."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._lock = threading.Lock()
        self._working = threading.Event()
        self._working.set()  # building the trainer is work too: the head waits for it
        self._closed = threading.Event()
        threading.Thread(target=self._beat, name="agentrl-rank-heartbeat", daemon=True).start()

    def _beat(self) -> None:
        while not self._closed.wait(HEARTBEAT_S):
            if self._working.is_set():
                with self._lock, contextlib.suppress(OSError):
                    self._connection.send(("beat", None, []))

    def recv(self) -> Any:
        message = self._connection.recv()
        self._working.set()
        return message

    def send(self, message: Any) -> None:
        self._working.clear()
        with self._lock:
            send_by_value(self._connection, message)

    def close(self) -> None:
        self._closed.set()
        self._connection.close()


def run_shipped(call: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """`call(*args, **kwargs)` with any shipped folder among `args` written to this host's disk for the call."""
    folders = [arg.materialize() if isinstance(arg, ShippedFolder) else None for arg in args]
    try:
        return call(*[folder or arg for folder, arg in zip(folders, args, strict=True)], **kwargs)
    finally:
        for folder in folders:
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
