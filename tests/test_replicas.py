"""Inference replicas: where each one runs, how the gateway spreads requests, and (on the real server)
swaps that never send a request to a replica without its adapter, and a replica dying mid-run."""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import signal

import httpx
import pytest

import agentrl
from agentrl.backend.serving.replicas import placements
from agentrl.backend.serving.server import server_command
from agentrl.gateway.upstream import AFFINITY_SLACK, Replica, Upstream, conversation_key
from agentrl.timeline import TIMELINE_FILE, read_timeline, recorder
from tests.helpers import spans_by_track


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


@pytest.mark.slow
async def test_two_replicas_serve_through_swaps_without_a_404_and_survive_one_dying(tmp_path, caplog):
    model = agentrl.TrainableModel(
        name="replicated",
        project="replicas",
        base_path=str(tmp_path),
        server=agentrl.ServerConfig(replicas=2, kv_cache_gib=1),
    )
    backend = agentrl.LocalBackend()
    statuses: collections.Counter[int] = collections.Counter()
    names: collections.Counter[str] = collections.Counter()
    stop = asyncio.Event()

    async def keep_asking() -> None:
        """Ask for whatever the model serves now, as a rollout would, until told to stop."""
        async with httpx.AsyncClient(
            timeout=120, headers={"Authorization": f"Bearer {backend.gateway.token}"}
        ) as client:
            while not stop.is_set():
                request = {
                    "model": model.inference_name,
                    "messages": [{"role": "user", "content": f"Say {statuses.total()}."}],
                    "max_tokens": 2,
                }
                statuses[(await client.post(f"{backend.base_url}/chat/completions", json=request)).status_code] += 1
                names[request["model"]] += 1
                # Pauses leave the trainer its cores: with both replicas busy on two cores, measured here, a
                # two-trajectory step took 44-54 s instead of ~2 s (threads spinning on shared cores).
                await asyncio.sleep(1.0)

    try:
        await model.register(backend)
        servers = backend.server.replicas
        assert len(servers) == 2 and {s.placement["VLLM_CPU_OMP_THREADS_BIND"] for s in servers} == {"0", "1"}
        askers = [asyncio.create_task(keep_asking()) for _ in range(4)]
        result = await model.train([await two_sampled(model)], agentrl.TrainConfig(learning_rate=1e-4))
        assert not result.skipped and result.step == 1  # a swap while requests stream
        # And the new name asked for at once. Under a step's load on two cores one request can take seconds
        # (CI saw two per asker in a whole step), so wait for the asks rather than for a fixed time.
        async with asyncio.timeout(180):
            while names["replicated@1"] < 4:
                await asyncio.sleep(0.2)
        stop.set()
        await asyncio.gather(*askers)
        assert set(statuses) == {200}, statuses  # no 404 for a name, no error at all
        assert names["replicated@0"] > 0 and names["replicated@1"] >= 4, names
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
        stop.set()
        await backend.close()
