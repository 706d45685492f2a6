"""Inference replicas: where each one runs, how the gateway spreads requests, and (on the real server)
swaps that never send a request to a replica without its adapter, and a replica dying mid-run; the same
for a replica on another "host" (its own process tree and folders, reached over loopback), which joins
the gateway with a token and gets each adapter pushed over HTTP."""

from __future__ import annotations

import asyncio
import collections
import hashlib
import io
import logging
import os
import secrets
import signal
import tarfile

import httpx
import psutil
import pytest

import agentrl
from agentrl.backend.serving.remote_replica import pack_adapter, unpack_adapter
from agentrl.backend.serving.replicas import placements
from agentrl.backend.serving.server import server_command
from agentrl.cli import app
from agentrl.foundation.errors import ServerError
from agentrl.foundation.timeline import TIMELINE_FILE, read_timeline, recorder
from agentrl.gateway.serve import Gateway
from agentrl.gateway.upstream import AFFINITY_SLACK, Replica, Upstream, conversation_key
from agentrl.records.checkpoints import ADAPTER_FILE
from tests.helpers import as_another_host, runner, spans_by_track


def test_cpu_replicas_get_their_own_cores_and_gpu_replicas_their_own_devices():
    assert placements(agentrl.ServerConfig(), gpu=False, cpus=[0, 1], gpu_count=0) == [{}]
    two = agentrl.ServerConfig(replicas=2)
    assert placements(two, gpu=False, cpus=[0, 1], gpu_count=0) == [
        {"VLLM_CPU_OMP_THREADS_BIND": "0"},
        {"VLLM_CPU_OMP_THREADS_BIND": "1"},
    ]
    assert placements(two, gpu=False, cpus=[0, 1, 2, 3, 4], gpu_count=0) == [
        {"VLLM_CPU_OMP_THREADS_BIND": "0,1,2"},
        {"VLLM_CPU_OMP_THREADS_BIND": "3,4"},
    ]
    tensor_parallel = agentrl.ServerConfig(replicas=2, tensor_parallel_size=2)
    assert placements(tensor_parallel, gpu=False, cpus=[0, 1, 2, 3], gpu_count=0) == [
        {"VLLM_CPU_OMP_THREADS_BIND": "0|1"},
        {"VLLM_CPU_OMP_THREADS_BIND": "2|3"},
    ]
    assert placements(tensor_parallel, gpu=True, cpus=[0], gpu_count=8) == [
        {"CUDA_VISIBLE_DEVICES": "0,1"},
        {"CUDA_VISIBLE_DEVICES": "2,3"},
    ]
    with pytest.raises(agentrl.ConfigurationError, match="need 4 GPUs; this machine has 2"):
        placements(tensor_parallel, gpu=True, cpus=[0], gpu_count=2)
    with pytest.raises(agentrl.ConfigurationError, match="need a core each"):
        placements(agentrl.ServerConfig(replicas=3), gpu=False, cpus=[0, 1], gpu_count=0)
    command = server_command("m", "base", 1, tensor_parallel, max_lora_rank=8, gpu=True)
    assert command[command.index("--tensor-parallel-size") + 1] == "2" and "--data-parallel-size" not in command


def test_a_conversation_stays_on_its_replica_until_that_one_is_much_busier():
    upstream = Upstream([Replica("http://a", "k"), Replica("http://b", "k")])
    conversations = [
        conversation_key({"model": "m@1", "messages": [{"role": "user", "content": f"question {i}"}]})
        for i in range(20)
    ]
    homes = collections.Counter(upstream.pick(key).url for key in conversations)
    assert min(homes["http://a"], homes["http://b"]) >= 5, homes  # conversations spread over both
    numbered = collections.Counter(
        upstream.pick(conversation_key({"model": "m", "prompt": f"Say {i}."})).url for i in range(20)
    )
    assert min(numbered.values()) >= 5 and len(numbered) == 2, numbered  # prompts differing in a digit too
    # A later turn of the same conversation (its first question, then more) lands on the same replica.
    first_turn = {"model": "m@1", "messages": [{"role": "user", "content": "question 0"}]}
    later_turn = {**first_turn, "messages": [*first_turn["messages"], {"role": "assistant", "content": "x"},
                                             {"role": "user", "content": "more"}]}  # fmt: skip
    assert conversation_key(first_turn) == conversation_key(later_turn) == conversations[0]
    home = upstream.pick(conversations[0])
    other = next(r for r in upstream.replicas if r is not home)
    for _ in range(other.in_flight + AFFINITY_SLACK - home.in_flight):
        home.request_sent()
    assert upstream.pick(conversations[0]) is home
    home.request_sent()
    assert upstream.pick(conversations[0]) is other  # too busy: the least busy replica takes it


def test_a_replicas_busy_stretches_are_spans_on_its_timeline_track():
    replica = Replica("http://a", "k", track="replica 3")
    recorder.take()
    replica.request_sent()
    replica.request_sent()
    replica.request_done()
    assert recorder.take() == []  # one request still in flight: the stretch goes on
    replica.request_done()
    replica.request_sent()
    replica.request_done()
    stretches = recorder.take()
    assert [(s.name, s.track, s.args) for s in stretches] == [("serving", "replica 3", {"requests": 2}),
                                                             ("serving", "replica 3", {"requests": 1})]  # fmt: skip
    assert stretches[0].end_s <= stretches[1].start_s and replica.sent == 3 and replica.in_flight == 0


def test_a_dead_replica_leaves_the_rotation_once_and_is_reported(caplog):
    notice = "the vLLM server at http://b exited with code 9; its log /runs/logs/vllm-1.log ends with: ..."
    dead = Replica("http://b", "k", death_notice=lambda: notice)
    upstream = Upstream([Replica("http://a", "k", death_notice=lambda: None), dead])
    with caplog.at_level(logging.WARNING):
        assert {upstream.pick(str(i)).url for i in range(10)} == {"http://a"}
    assert dead.removed == notice
    assert [r.message for r in caplog.records].count(f"replica http://b left the rotation (1 left): {notice}") == 1
    upstream.replicas[0].removed = "gone too"
    assert upstream.pick("x") is None and "exited with code 9" in upstream.why_none()


async def two_sampled(model: agentrl.TrainableModel) -> agentrl.TrajectoryGroup:
    async def one(reward: float) -> agentrl.Trajectory:
        prompt = [{"role": "user", "content": "Name a colour."}]
        completion = await model.openai_client().chat.completions.create(
            model=model.inference_name, messages=prompt, max_tokens=4, temperature=1.0
        )
        return agentrl.Trajectory(messages_and_choices=[*prompt, completion.choices[0]], reward=reward)

    return agentrl.TrajectoryGroup(await asyncio.gather(one(0.0), one(1.0)))


class KeepAsking:
    """Clients that ask for whatever the model serves now, as rollouts would, until `finish`: each answer's status
    and the name asked for are counted."""

    def __init__(self, model: agentrl.TrainableModel, backend: agentrl.LocalBackend, clients: int) -> None:
        self.model, self.backend = model, backend
        self.statuses: collections.Counter[int] = collections.Counter()
        self.names: collections.Counter[str] = collections.Counter()
        self.stop = asyncio.Event()
        self.tasks = [asyncio.create_task(self.ask()) for _ in range(clients)]

    async def ask(self) -> None:
        headers = {"Authorization": f"Bearer {self.backend.gateway.token}"}
        async with httpx.AsyncClient(timeout=120, headers=headers) as client:
            while not self.stop.is_set():
                request = {
                    "model": self.model.inference_name,
                    "messages": [{"role": "user", "content": f"Say {self.statuses.total()}."}],
                    "max_tokens": 2,
                }
                answer = await client.post(f"{self.backend.base_url}/chat/completions", json=request)
                self.statuses[answer.status_code] += 1
                self.names[request["model"]] += 1
                # Pauses leave the trainer its cores: with both replicas busy on two cores, measured here, a
                # two-trajectory step took 44-54 s instead of ~2 s (threads spinning on shared cores).
                await asyncio.sleep(1.0)

    async def until_asked(self, name: str, times: int) -> None:
        """Until `name` was asked for `times` times. Under a step's load on two cores one request can take seconds
        (CI saw two per asker in a whole step), so this waits for the asks rather than for a fixed time."""
        async with asyncio.timeout(180):
            while self.names[name] < times:
                await asyncio.sleep(0.2)

    async def finish(self) -> None:
        self.stop.set()
        await asyncio.gather(*self.tasks)


@pytest.mark.slow
async def test_two_replicas_serve_through_swaps_without_a_404_and_survive_one_dying(tmp_path, caplog):
    model = agentrl.TrainableModel(
        name="replicated",
        project="replicas",
        base_path=str(tmp_path),
        server=agentrl.ServerConfig(replicas=2, kv_cache_gib=1),
    )
    backend = agentrl.LocalBackend()
    askers = None
    try:
        await model.register(backend)
        servers = backend.server.replicas
        assert len(servers) == 2 and {s.placement["VLLM_CPU_OMP_THREADS_BIND"] for s in servers} == {"0", "1"}
        askers = KeepAsking(model, backend, clients=4)
        result = await model.train([await two_sampled(model)], agentrl.TrainConfig(learning_rate=1e-4))
        assert not result.skipped and result.step == 1  # a swap while requests stream
        await askers.until_asked("replicated@1", 4)  # and the new name asked for at once
        await askers.finish()
        assert set(askers.statuses) == {200}, askers.statuses  # no 404 for a name, no error at all
        assert askers.names["replicated@0"] > 0 and askers.names["replicated@1"] >= 4, askers.names
        sent = [replica.sent for replica in backend.gateway.upstream.replicas]
        assert all(count > 0 for count in sent), sent  # both replicas answered

        # One replica dies: it leaves the rotation with its log named, the other serves and trains.
        os.killpg(servers[1].process.pid, signal.SIGKILL)
        servers[1].process.wait()
        with caplog.at_level(logging.WARNING):
            group = await two_sampled(model)
            result = await model.train([group], agentrl.TrainConfig(learning_rate=1e-4))
        assert not result.skipped and result.step == 2
        assert any("left the rotation (1 left)" in r.message and "vllm-1.log" in r.message for r in caplog.records)
        async with httpx.AsyncClient(
            timeout=60, headers={"Authorization": f"Bearer {backend.gateway.token}"}
        ) as client:
            health = (await client.get(f"{backend.gateway.root_url}/health")).json()
        assert health["replicas"] == 2 and health["replicas_in_rotation"] == 1
        await two_sampled(model)  # the new adapter is served by the survivor
        assert model.inference_name == "replicated@2"
        # The timeline has a row per replica: its busy stretches, each request counted in one of them.
        tracks = spans_by_track(read_timeline(model.run_dir / TIMELINE_FILE))
        serving = [e for track in ("replica 0", "replica 1") for e in tracks[track]]
        assert {e["name"] for e in serving} == {"serving"} and all(e["args"]["requests"] >= 1 for e in serving)
    finally:
        if askers is not None:
            await askers.finish()
        await backend.close()


def test_an_adapter_push_is_written_only_when_its_checksum_matches(tmp_path):
    source = tmp_path / "checkpoint"
    source.mkdir()
    (source / ADAPTER_FILE).write_bytes(os.urandom(4096))
    (source / "adapter_config.json").write_text('{"r": 8}')
    (source / "optimizer.pt").write_bytes(b"stays on the head")
    data = pack_adapter(source)
    sha256 = hashlib.sha256(data).hexdigest()
    torn = data[:-1] + bytes([data[-1] ^ 1])
    with pytest.raises(ServerError, match="push it again"):
        unpack_adapter(torn, sha256, tmp_path / "refused")
    assert not (tmp_path / "refused").exists()
    unpack_adapter(data, sha256, tmp_path / "served")
    assert sorted(p.name for p in (tmp_path / "served").iterdir()) == sorted([ADAPTER_FILE, "adapter_config.json"])
    assert (tmp_path / "served" / ADAPTER_FILE).read_bytes() == (source / ADAPTER_FILE).read_bytes()
    buffer = io.BytesIO()  # a push with anything but the served files is refused, however its checksum reads
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(source / "optimizer.pt", arcname="../optimizer.pt")
    other = buffer.getvalue()
    with pytest.raises(ServerError, match="not"):
        unpack_adapter(other, hashlib.sha256(other).hexdigest(), tmp_path / "other")


async def test_only_the_join_token_opens_the_replica_door():
    closed = Gateway(token="sample")
    join = secrets.token_urlsafe(32)
    door = Gateway(token="sample", admin_token="admin", join_token=join)
    await closed.start()
    await door.start()
    try:
        async with httpx.AsyncClient(timeout=10) as client:

            async def settings(gateway: Gateway, token: str) -> httpx.Response:
                headers = {"Authorization": f"Bearer {token}"}
                return await client.get(f"{gateway.root_url}/replicas/settings", headers=headers)

            assert (await settings(closed, "sample")).status_code == 404
            assert "AGENTRL_JOIN_TOKEN" in (await settings(closed, "sample")).json()["error"]["message"]
            for token in ("sample", "admin", "wrong"):  # the gateway's other tokens do not open it
                refused = await settings(door, token)
                assert refused.status_code == 401 and "AGENTRL_JOIN_TOKEN" in refused.text
            assert (await settings(door, join)).status_code == 503  # no model registered yet: try again
            offer = await client.post(f"{door.root_url}/replicas/join", headers={"Authorization": f"Bearer {join}"},
                                      content=b"{}")  # fmt: skip
            assert offer.status_code == 503
            models = await client.get(f"{door.base_url}/models", headers={"Authorization": f"Bearer {join}"})
            assert models.status_code == 401  # and the join token opens nothing else
    finally:
        await closed.stop()
        await door.stop()


def test_the_replica_command_names_what_is_missing(monkeypatch):
    monkeypatch.delenv("AGENTRL_JOIN_TOKEN", raising=False)
    missing = runner.invoke(app, ["backend", "replica", "--join", "127.0.0.1:9"])
    assert missing.exit_code == 2 and "set AGENTRL_JOIN_TOKEN" in missing.output
    monkeypatch.setenv("AGENTRL_JOIN_TOKEN", "t")
    weak = runner.invoke(app, ["backend", "replica", "--join", "127.0.0.1:9"])
    assert weak.exit_code == 2 and "AGENTRL_JOIN_TOKEN is too weak" in weak.output
    monkeypatch.setenv("AGENTRL_JOIN_TOKEN", secrets.token_urlsafe(32))
    bad = runner.invoke(app, ["backend", "replica", "--join", "nowhere"])
    assert bad.exit_code == 2 and "HOST:PORT" in bad.output
    unreachable = runner.invoke(app, ["backend", "replica", "--join", "127.0.0.1:9", "--wait", "0"])
    assert unreachable.exit_code == 1 and "is it serving?" in unreachable.output


@pytest.mark.slow
async def test_a_replica_on_another_host_gets_each_adapter_over_http_and_leaves_when_its_host_dies(tmp_path, caplog):
    model = agentrl.TrainableModel(
        name="spread", project="replicas", base_path=str(tmp_path / "head"), server=agentrl.ServerConfig(kv_cache_gib=1)
    )
    join_token = secrets.token_urlsafe(32)
    backend = agentrl.LocalBackend(join_token=join_token)
    askers = None

    other_host = tmp_path / "other-host"
    other_host.mkdir()
    agent = None
    try:
        await model.register(backend)
        port = backend.gateway.port
        agent = as_another_host(other_host, join_token, ["backend", "replica", "--join", f"127.0.0.1:{port}"])
        async with asyncio.timeout(400):  # its vLLM server starts while the head's runs: ~1-3 min on 2 cores
            while len(backend.gateway.upstream.replicas) < 2:
                assert agent.poll() is None, "the replica agent exited before it joined"
                await asyncio.sleep(1.0)
        remote = backend.server.replicas[1]
        assert remote.pushed_bytes > 0  # step 0's adapter reached it before it took a request

        def served_on_the_other_host(step: int) -> bool:
            ours = (model.run_dir / "checkpoints" / f"{step:04d}" / ADAPTER_FILE).read_bytes()
            theirs = [p.read_bytes() for p in (other_host / "agentrl-replica" / "adapters").glob(f"*/{ADAPTER_FILE}")]
            return ours in theirs

        assert served_on_the_other_host(0)
        askers = KeepAsking(model, backend, clients=3)
        result = await model.train([await two_sampled(model)], agentrl.TrainConfig(learning_rate=1e-4))
        assert not result.skipped and result.step == 1 and served_on_the_other_host(1)
        await askers.until_asked("spread@1", 6)
        await askers.finish()
        assert set(askers.statuses) == {200}, askers.statuses  # no 404 through the swap, on either host
        sent = [replica.sent for replica in backend.gateway.upstream.replicas]
        assert all(count > 0 for count in sent), sent  # the other host answered its share

        # The other host dies (its agent and its vLLM server): it leaves the rotation, named; the run trains on.
        doomed = [psutil.Process(agent.pid), *psutil.Process(agent.pid).children(recursive=True)]
        for process in doomed:
            process.send_signal(signal.SIGKILL)
        psutil.wait_procs(doomed, timeout=30)
        with caplog.at_level(logging.WARNING):
            result = await model.train([await two_sampled(model)], agentrl.TrainConfig(learning_rate=1e-4))
            await two_sampled(model)
        assert not result.skipped and result.step == 2
        assert any("left the rotation (1 left)" in r.message and "on host" in r.message for r in caplog.records)
        assert backend.gateway.upstream.in_rotation() == backend.gateway.upstream.replicas[:1]
    finally:
        if askers is not None:
            await askers.finish()
        await backend.close()
        if agent is not None and agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
