"""The vLLM zygote (agentrl_vllm.zygote): servers forked from one import of vLLM, their exit codes, their
lifetime tied to the connection that asked for them, and the fallback when no zygote answers."""

import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from agentrl import ServerConfig, ServerError
from agentrl.backend.serving import zygote as zygote_client
from agentrl.backend.serving.server import VLLMServer, server_command, server_env, without_secrets
from agentrl.backend.serving.zygote import ZYGOTE_ENV, ZygoteServer, fork_server, start_zygote
from tests.helpers import group_processes


def test_a_handle_reports_the_exit_the_zygote_sends_and_times_out_like_popen():
    ours, zygotes = socket.socketpair()
    handle = ZygoteServer(ours, pid=12345)
    assert handle.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        handle.wait(timeout=0.1)
    zygotes.sendall(json.dumps({"exit": -9}).encode() + b"\n")
    assert handle.wait(timeout=5) == -9 and handle.returncode == -9 and handle.connection is None
    zygotes.close()


def test_a_handle_whose_zygote_died_reports_the_signal_its_servers_got():
    ours, zygotes = socket.socketpair()
    handle = ZygoteServer(ours, pid=12345)
    zygotes.close()  # the zygote died: its servers got SIGTERM from their parent-death signal
    assert handle.poll() == -signal.SIGTERM


async def test_without_an_answering_zygote_the_server_is_started_directly(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(zygote_client, "READY_WAIT_S", 0.3)
    assert await fork_server(str(tmp_path / "missing.sock"), [], {}, tmp_path / "log") is None
    stale = tmp_path / "stale.sock"  # a socket file left by a zygote that died: nothing listens
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(stale))
    assert await fork_server(str(stale), [], {}, tmp_path / "log") is None
    assert "starting the server directly" in caplog.text


@pytest.fixture(scope="module")
def zygote_socket(tmp_path_factory):
    """The session's zygote (tests/conftest.py), or one for this module when the suite runs without it."""
    if os.environ.get(ZYGOTE_ENV):
        yield os.environ[ZYGOTE_ENV]
        return
    folder = tmp_path_factory.mktemp("zygote")
    process = start_zygote(folder / "z.sock", folder / "z.log", without_secrets(dict(os.environ)))
    yield str(folder / "z.sock")
    process.terminate()
    process.wait(timeout=30)


@pytest.mark.slow  # forks real vLLM servers
async def test_a_forked_server_reports_its_exit_code_and_ends_when_its_connection_closes(
    tmp_path, base_model_path, zygote_socket, monkeypatch
):
    monkeypatch.setenv(ZYGOTE_ENV, zygote_socket)
    monkeypatch.chdir(tmp_path)  # paths relative to this process's directory, not the zygote's
    # A bad flag: vLLM's argument parser exits with 2, in the forked process as in a fresh one.
    config = ServerConfig(extra_args=("--max-num-seqs", "not-a-number"))
    server = VLLMServer(base_model_path, Path("logs/bad.log"), config, max_lora_rank=8)
    started = time.monotonic()
    with pytest.raises(ServerError, match=r"exited with code 2 before it was ready; log logs/bad\.log"):
        await server.start()
    assert time.monotonic() - started < 60
    assert "not-a-number" in (tmp_path / "logs" / "bad.log").read_text()

    # A good one, forked, then let go of without stop(): the zygote ends its whole process group.
    config = ServerConfig()
    env = server_env(config, gpu=False, api_key="key")
    command = server_command(base_model_path, "base", 0, config, max_lora_rank=8, gpu=False)
    handle = await fork_server(zygote_socket, command[3:], env, tmp_path / "good.log")
    assert handle is not None and handle.poll() is None
    await asyncio.sleep(3)  # importing nothing, it is loading the model by now
    assert group_processes(handle.pid)
    handle.close()
    deadline = time.monotonic() + 30
    while group_processes(handle.pid) and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
    assert group_processes(handle.pid) == []


@pytest.mark.slow  # needs a zygote that has imported vLLM
async def test_a_server_asking_for_other_openmp_spin_than_the_zygotes_is_declined_and_started_directly(
    tmp_path, zygote_socket, caplog
):
    # libgomp read GOMP_SPINCOUNT when the zygote loaded torch: a fork would spin the zygote's count whatever its
    # environment said (a pipelined run's bound lost), so the zygote declines and the client starts it afresh.
    caplog.set_level(logging.INFO, logger=zygote_client.__name__)
    env = {**without_secrets(dict(os.environ)), "GOMP_SPINCOUNT": "1234"}
    assert await fork_server(zygote_socket, ["--help"], env, tmp_path / "declined.log") is None
    assert "declined a server" in caplog.text and "'GOMP_SPINCOUNT': '1234'" in caplog.text
    assert not (tmp_path / "declined.log").exists()  # nothing was forked
