"""A process that imports vLLM's API server once and forks a CPU server from it per request.

Importing `vllm.entrypoints.openai.api_server` is about half of a CPU server's start (5.6 s of 11 s
on a 2-core bf16 EPYC). A session that starts many servers (the test suite, its notebooks and CLI
runs) pays it once here; agentrl uses the zygote when AGENTRL_VLLM_ZYGOTE names its socket
(`agentrl.backend.serving.zygote`), for its CPU servers: nothing here binds threads to cores (a server of
one replica and one rank runs its model in the forked process; replicas spawn the workers that bind them).

Protocol, over a Unix socket, one connection per server: the client sends one JSON line
`{"argv": [...], "env": {...}, "cwd": dir, "log": path}`; the zygote answers `{"pid": N}` once the server is
forked and `{"exit": code}` when it has exited, or `{"declined": why}` for a server whose OpenMP settings it
cannot give (`OPENMP_READ_AT_LOAD`), or `{"error": why}`. The server lives as long as its connection: when the
client closes it or dies, the zygote sends its process group SIGTERM, then SIGKILL 5 s later.

Run: `python -m agentrl_vllm.zygote SOCKET_PATH`. It dies with the process that started it, and its
servers with it. Imports nothing of agentrl (it runs beside vLLM, like the rest of agentrl_vllm).
"""

from __future__ import annotations

import atexit
import ctypes
import gc
import json
import os
import select
import signal
import socket
import sys
import time
from typing import Any, NoReturn

from agentrl_vllm.api_server import VLLM_MODULE, serve_then_exit

PRELOAD = (
    "vllm.entrypoints.openai.api_server",
    "vllm.entrypoints.launchers.cli_args",
    "vllm.v1.engine.async_llm",
    "vllm.v1.engine.core",
    "vllm.v1.executor.abstract",
    "vllm.v1.worker.cpu_worker",
    "vllm.v1.worker.cpu_model_runner",
    "vllm.v1.sample.ops.penalties",
    "vllm.model_executor.layers.quantization.online.base",
    "vllm.model_executor.models.llama",
    "vllm.lora.punica_wrapper.punica_cpu",
    "vllm.kernels",
)
"""Modules every CPU server imports before it is healthy (the API server, then the engine, worker, model
runner and LoRA wrapper it loads later: another ~1.2 s of imports, `-X importtime` on a 2-core bf16 EPYC);
none reads agentrl's settings at import."""
OPENMP_READ_AT_LOAD = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY")
"""libgomp's settings that it reads once, when torch loads it (in the zygote, before any fork) and that nothing
can change later: a server that asks for other values than the zygote's is declined, and started afresh."""
KILL_AFTER_S = 5.0
"""Seconds between SIGTERM and SIGKILL for a server whose client went away: nobody waits for its answers,
and a server still loading its model ignores SIGTERM (it took SIGKILL 20 s later on a 2-core EPYC)."""


def die_with_parent() -> None:
    """SIGTERM to this process when its parent dies, even by SIGKILL (Linux). In a child before exec too
    (`preexec_fn`): the signal follows the thread that started the child, so start it from a long-lived
    thread (the event loop's), never from a short-lived worker thread."""
    if sys.platform == "linux":
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def send(connection: socket.socket, message: dict[str, Any]) -> None:
    """One JSON line to a client; a client that went away is not an error."""
    try:
        connection.sendall(json.dumps(message).encode() + b"\n")
    except OSError:
        pass


def read_message(connection: socket.socket, timeout_s: float) -> dict[str, Any]:
    """One JSON line, read byte by byte so nothing after its newline is consumed (both ends use it)."""
    connection.settimeout(timeout_s)
    data = b""
    while not data.endswith(b"\n"):
        byte = connection.recv(1)
        if not byte:
            raise ConnectionError("the other end closed the connection before its message")
        data += byte
    connection.settimeout(None)
    message: dict[str, Any] = json.loads(data)
    return message


def show_command(argv: list[str]) -> None:
    """Show the server in `ps` as the command it stands for, not as the zygote. Before the environment
    changes: setproctitle finds the room it writes into from the environment's original place, and vLLM's
    own titles (its engine's `VLLM::EngineCore`) fail without that."""
    try:
        import setproctitle
    except ImportError:  # optional for vLLM too; the server then shows as the zygote
        return
    setproctitle.setproctitle(" ".join([sys.executable, "-m", "agentrl_vllm.api_server", *argv]))


def become_server(request: dict[str, Any]) -> None:
    """In the forked child: the process, files, directory and environment of a server started afresh."""
    os.setsid()  # its own process group, like `start_new_session`: the group ends with the engine it forks
    die_with_parent()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    atexit._clear()
    os.chdir(request["cwd"])  # the client's: a relative --model or log path means what it meant there
    log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    show_command(request["argv"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = [VLLM_MODULE, *request["argv"]]
    threads = os.environ.get("OMP_NUM_THREADS")
    if threads:  # OpenMP read the zygote's environment when torch loaded; the server's count wins
        import torch

        torch.set_num_threads(int(threads))


def run_server(request: dict[str, Any]) -> NoReturn:
    """In the forked child: become the server `request` describes and exit with its code, whatever
    happens (it must never return into the zygote's loop)."""
    serve_then_exit(lambda: become_server(request))


class Zygote:
    """The accept/fork/reap loop: one server per connection, ended when its connection closes."""

    def __init__(self, listener: socket.socket) -> None:
        self.listener = listener
        self.servers: dict[socket.socket, int] = {}  # connection -> server pid
        self.kill_at: dict[int, float] = {}  # pid of a server told to stop -> when to SIGKILL its group

    def serve_forever(self) -> None:
        while True:
            readable, _, _ = select.select([self.listener, *self.servers], [], [], 0.2)
            for ready in readable:
                if ready is self.listener:
                    self.accept()
                else:
                    self.client_spoke(ready)
            self.reap()
            self.kill_overdue()

    def accept(self) -> None:
        connection, _ = self.listener.accept()
        try:
            request = read_message(connection, timeout_s=10.0)
        except (OSError, ValueError) as error:
            send(connection, {"error": f"bad request: {error}"})
            connection.close()
            return
        if differing := [name for name in OPENMP_READ_AT_LOAD if request["env"].get(name) != os.environ.get(name)]:
            here = {name: os.environ.get(name) for name in differing}
            asked = {name: request["env"].get(name) for name in differing}
            send(connection, {"declined": f"libgomp read {here} when the zygote loaded torch; the server asks {asked}"})
            connection.close()
            return
        try:
            pid = os.fork()
        except OSError as error:  # out of memory or processes: the client starts its server itself
            send(connection, {"error": f"fork failed: {error}"})
            connection.close()
            return
        if pid == 0:
            for other in (self.listener, connection, *self.servers):
                other.close()
            run_server(request)
        self.servers[connection] = pid
        send(connection, {"pid": pid})

    def client_spoke(self, connection: socket.socket) -> None:
        """A client sends nothing after its request, so a readable connection has closed (or broken)."""
        try:
            data = connection.recv(4096)
        except OSError:
            data = b""
        if data:
            return
        pid = self.servers.pop(connection)
        connection.close()
        self.signal_group(pid, signal.SIGTERM)
        self.kill_at[pid] = time.monotonic() + KILL_AFTER_S

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.signal_group(pid, signal.SIGKILL)  # engine processes still in its group end with it
            self.kill_at.pop(pid, None)
            for connection, server in list(self.servers.items()):
                if server == pid:
                    send(connection, {"exit": os.waitstatus_to_exitcode(status)})  # Popen's returncode: code or -signal
                    del self.servers[connection]
                    connection.close()

    def kill_overdue(self) -> None:
        now = time.monotonic()
        for pid, deadline in list(self.kill_at.items()):
            if now >= deadline:
                self.signal_group(pid, signal.SIGKILL)
                del self.kill_at[pid]

    @staticmethod
    def signal_group(pid: int, sig: signal.Signals) -> None:
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def main(socket_path: str) -> None:
    """Import vLLM, then listen on `socket_path` (created by rename once ready, so it exists only then)."""
    die_with_parent()
    import importlib

    for module in PRELOAD:
        importlib.import_module(module)
    import vllm.plugins

    if vllm.plugins.plugins_loaded:  # they read the server's environment: each server must load its own
        raise RuntimeError("vLLM loaded its plugins while the zygote imported it; the zygote cannot serve")
    # Every server inherits the imports' ~710k objects; vLLM runs gc.collect() 5 times while it loads a model, and
    # each walked all of them (1.2 s of a 4.3 s start on a 2-core bf16 EPYC). Frozen, collections skip them.
    gc.collect()
    gc.freeze()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    staging = f"{socket_path}.{os.getpid()}.tmp"
    listener.bind(staging)
    listener.listen(64)
    os.replace(staging, socket_path)
    print(f"agentrl_vllm.zygote: ready on {socket_path}", flush=True)
    Zygote(listener).serve_forever()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m agentrl_vllm.zygote SOCKET_PATH")
    main(sys.argv[1])
