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
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, Listener
from pathlib import Path
from typing import Any

from agentrl.backend.training.rank_links import SILENCE_S, RemoteRank
from agentrl.errors import ConfigurationError, TrainingError

logger = logging.getLogger(__name__)

HEARTBEAT_S = 2.0
"""How often a remote rank says it is alive while it works on a call."""


@dataclass(frozen=True)
class JoinPoint:
    """Where trainer ranks from other hosts join this head: the address they reach it at (it listens
    there), the token they must present, and how many of the ranks join from elsewhere."""

    host: str
    port: int
    token: str
    remote_ranks: int
    silence_s: float = SILENCE_S
    """How long a call waits without a word from a remote rank before it calls that host gone."""

    def __post_init__(self) -> None:
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


def accept_ranks(
    join: JoinPoint, ranks: list[int], world_size: int, rendezvous: str, trainer_args: dict[str, Any], timeout_s: float
) -> list[tuple[Connection, RemoteRank]]:
    """Listen at the join point until a rank has joined for each of `ranks` (in arrival order), and send each
    its welcome: (rank, world size, rendezvous, trainer arguments). A caller with the wrong token is refused
    and logged; too few ranks within `timeout_s` is a TrainingError that says how to start them."""
    joined: list[tuple[Connection, RemoteRank]] = []
    with Listener((join.host, join.port), authkey=join.token.encode()) as listener:

        def accept_all() -> None:
            while len(joined) < len(ranks):
                try:
                    connection = listener.accept()
                except AuthenticationError as error:
                    logger.warning("refused a trainer rank at %s:%d: %s (wrong token)", join.host, join.port, error)
                    continue
                except OSError:  # the listener was closed: the wait is over
                    return
                _, host, pid = connection.recv()
                rank = ranks[len(joined)]
                connection.send((rank, world_size, rendezvous, trainer_args))
                joined.append((connection, RemoteRank(str(host), int(pid), join.silence_s)))
                logger.info("trainer rank %d joined from %s (pid %s)", rank, host, pid)

        waiter = threading.Thread(target=accept_all, name="agentrl-rank-join", daemon=True)
        waiter.start()
        waiter.join(timeout_s)
        if waiter.is_alive() or len(joined) < len(ranks):
            listener.close()
            for connection, _ in joined:
                connection.close()
            raise TrainingError(
                f"waited {timeout_s:.0f} s for {len(ranks)} trainer ranks to join at {join.host}:{join.port}; "
                f"{len(joined)} joined. On each other host run: agentrl backend rank --join "
                f"{join.host}:{join.port} (with AGENTRL_JOIN_TOKEN set to this head's join token)"
            )
    return joined


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
