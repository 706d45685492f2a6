"""agentrl's side of `agentrl_vllm.zygote`: start a zygote, and ask it for a server.

Opt-in: where AGENTRL_VLLM_ZYGOTE names a zygote's socket, `VLLMServer.start` forks each CPU server
from that zygote instead of starting a fresh Python that imports vLLM again: about 5 s less per start
on a 2-core CPU (a replica's engine and worker, which bind cores, are still spawned by it). The test
suite starts one for the session. The handle it returns answers like the `subprocess.Popen` it
replaces (pid, poll, wait, returncode), and the server ends when this process closes the handle's
connection, or dies.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from agentrl.backend.processes import die_with_parent
from agentrl_vllm.zygote import read_message

ZYGOTE_ENV = "AGENTRL_VLLM_ZYGOTE"
"""The socket of the zygote this process's CPU servers fork from; unset: each server is its own Python."""
READY_WAIT_S = 60.0
"""How long a server start waits for a zygote that is still importing vLLM (it takes ~6 s on 2 cores)."""

logger = logging.getLogger(__name__)


def zygote_socket() -> str | None:
    """The zygote socket this process was told to use (AGENTRL_VLLM_ZYGOTE), or None."""
    return os.environ.get(ZYGOTE_ENV) or None


def start_zygote(socket_path: Path, log_path: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Start a zygote that will listen on `socket_path` once it has imported vLLM; it dies with this process."""
    socket_path.unlink(missing_ok=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "agentrl_vllm.zygote", str(socket_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )


class ZygoteServer:
    """A server forked by the zygote, seen as the part of `subprocess.Popen` that VLLMServer uses."""

    def __init__(self, connection: socket.socket, pid: int) -> None:
        self.connection: socket.socket | None = connection
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """The exit code once the server has exited, else None (never blocks)."""
        self._read(timeout_s=0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the server to exit; raises subprocess.TimeoutExpired like Popen.wait."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"zygote server {self.pid}", timeout or 0.0)
            self._read(timeout_s=left)
        return self.returncode

    def close(self) -> None:
        """Let go of the server: the zygote ends it if it still runs (VLLMServer.stop has ended it already)."""
        if self.connection is not None:
            self.connection.close()
            self.connection = None

    def _read(self, timeout_s: float | None) -> None:
        if self.connection is None:
            return
        readable, _, _ = select.select([self.connection], [], [], timeout_s)
        if not readable:
            return
        try:
            data = self.connection.recv(4096)
        except OSError:
            data = b""
        messages = [json.loads(line) for line in data.splitlines() if line.strip()]
        exits = [message["exit"] for message in messages if "exit" in message]
        if exits or not data:
            # No data: the zygote itself died, and its servers got SIGTERM from their parent-death signal.
            self.returncode = int(exits[0]) if exits else -signal.SIGTERM
            self.connection.close()
            self.connection = None


async def fork_server(socket_path: str, argv: list[str], env: dict[str, str], log_path: Path) -> ZygoteServer | None:
    """A server forked by the zygote at `socket_path` with vLLM's `argv` and `env`, logging to `log_path`;
    None (with a warning) when no zygote answers, so the caller starts the server itself."""
    deadline = time.monotonic() + READY_WAIT_S
    while not os.path.exists(socket_path):
        if time.monotonic() > deadline:
            logger.warning(
                "no vLLM zygote at %s (%s) after %.0f s; starting the server directly",
                socket_path,
                ZYGOTE_ENV,
                READY_WAIT_S,
            )
            return None
        await asyncio.sleep(0.1)
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(socket_path)
        request = {"argv": argv, "env": env, "cwd": os.getcwd(), "log": str(log_path.absolute())}
        connection.sendall(json.dumps(request).encode() + b"\n")
        reply = await asyncio.to_thread(read_message, connection, 30.0)
    except (OSError, ValueError) as error:
        connection.close()
        logger.warning(
            "the vLLM zygote at %s did not fork a server (%s); starting the server directly", socket_path, error
        )
        return None
    if "declined" in reply:  # its OpenMP settings are not the zygote's (agentrl_vllm.zygote.OPENMP_READ_AT_LOAD)
        connection.close()
        logger.info(
            "the vLLM zygote at %s declined a server (%s); starting it directly", socket_path, reply["declined"]
        )
        return None
    if "pid" not in reply:
        connection.close()
        logger.warning("the vLLM zygote at %s refused a server (%s); starting the server directly", socket_path, reply)
        return None
    return ZygoteServer(connection, int(reply["pid"]))
