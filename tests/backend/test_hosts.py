"""One model across "hosts" on one machine, through a real server: the trainer sharded (FSDP2) over a rank on
the head and a rank joined from another host (its own process group and folders, loopback only). The other
host dies mid-run: the step fails naming it, and registering again (once a rank has joined again) resumes
from the last checkpoint on both ranks."""

from __future__ import annotations

import os
import re
import secrets
import signal
import socket

import pytest
import torch
from safetensors.torch import load_file

import agentrl
from agentrl.backend.processes import free_port
from tests.helpers import alternating_reward_groups, join_from_another_host


@pytest.mark.slow
async def test_a_sharded_run_across_two_hosts_loses_one_and_resumes_from_its_checkpoint(tmp_path):
    port, token = free_port(), secrets.token_urlsafe(16)
    model = agentrl.TrainableModel(
        name="across", project="hosts", base_path=str(tmp_path / "head"), server=agentrl.ServerConfig(kv_cache_gib=1)
    )
    join = agentrl.JoinPoint("127.0.0.1", port, token, remote_ranks=1)
    backend = agentrl.LocalBackend(trainer_ranks=2, shard_trainer=True, trainer_join=join)
    config = agentrl.TrainConfig(learning_rate=1e-4)
    (tmp_path / "host-1").mkdir()
    other_host = join_from_another_host(tmp_path / "host-1", port, token)
    try:
        await model.register(backend)
        first = await model.train(await alternating_reward_groups(model, size=2), config)
        assert not first.skipped and first.step == 1
        pids = backend.trainer.pids

        os.killpg(other_host.pid, signal.SIGKILL)  # the other host goes, mid-run
        other_host.wait()
        groups = await alternating_reward_groups(model, size=2)
        gone = rf"trainer rank 1 on host {re.escape(socket.gethostname())} \(pid {pids[1]}\) closed its connection"
        with pytest.raises(agentrl.BackendBrokenError, match=gone) as failed:  # the ranks went: register again
            await model.train(groups, config)
        assert "Register the model again" in str(failed.value)

        (tmp_path / "host-1-again").mkdir()
        other_host = join_from_another_host(tmp_path / "host-1-again", port, token)  # the host is back
        await model.register(backend)  # the ranks rebuilt, from the last checkpoint
        assert await model.get_step() == 1 and model.inference_name == "across@1"
        saved = load_file(model.run_dir / "checkpoints" / "0001" / "adapter_model.safetensors")
        for rank in (0, 1):
            live = backend.trainer.adapter_weights(backend.session(model).adapter, rank)
            assert saved.keys() == live.keys()
            for key in saved:
                torch.testing.assert_close(live[key].float(), saved[key].float(), rtol=0, atol=0)
        resumed = await model.train(await alternating_reward_groups(model, size=2), config)
        assert not resumed.skipped and resumed.step == 2
    finally:
        await backend.close()
        if other_host.poll() is None:
            os.killpg(other_host.pid, signal.SIGKILL)


def _join_in_background(join, ranks: list[int], timeout_s: float):
    from concurrent.futures import ThreadPoolExecutor

    from agentrl.backend.training.ranks.rank_hosts import accept_ranks

    pool = ThreadPoolExecutor(1)
    return pool.submit(accept_ranks, join, ranks, 2, "tcp://head:1", {"seed": 1}, timeout_s)


def _connect_when_listening(port: int) -> socket.socket:
    import time

    deadline = time.monotonic() + 10
    while True:
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=5)
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_a_port_scan_a_silent_connection_and_a_wrong_token_do_not_stop_a_rank_joining():
    """The rank join, on loopback with the joining side's real client: strays before the rank are turned away
    one by one while the wait goes on."""
    from multiprocessing import AuthenticationError
    from multiprocessing.connection import Client

    port, token = free_port(), secrets.token_urlsafe(32)
    waiting = _join_in_background(agentrl.JoinPoint("127.0.0.1", port, token, remote_ranks=1), [1], timeout_s=60)
    _connect_when_listening(port).close()  # a port scan's connect-and-close
    silent = _connect_when_listening(port)  # a health check that connects and says nothing
    with pytest.raises(AuthenticationError):
        Client(("127.0.0.1", port), authkey=b"not-the-token")
    rank = Client(("127.0.0.1", port), authkey=token.encode())
    rank.send(("hello", "host-2", 4242))
    assert rank.recv() == (1, 2, "tcp://head:1", {"seed": 1})
    ((connection, remote),) = waiting.result(timeout=30)
    assert (remote.host, remote.pid) == ("host-2", 4242)
    connection.send("still talking")
    assert rank.recv() == "still talking"
    silent.close()
    rank.close()
    connection.close()


def test_a_join_that_gets_too_few_ranks_says_how_long_it_waited_and_what_it_turned_away():
    port = free_port()
    waiting = _join_in_background(agentrl.JoinPoint("127.0.0.1", port, secrets.token_urlsafe(32), 1), [1], 2)
    _connect_when_listening(port).close()
    # A connection closed at once ends as EOF or as a reset, as the kernel reports it: either is its reason
    with pytest.raises(
        agentrl.TrainingError,
        match=r"waited [2-9] s .* 0 joined; turned away 1 connections \(127.0.0.1: (EOFError|ConnectionResetError)",
    ):
        waiting.result(timeout=30)
