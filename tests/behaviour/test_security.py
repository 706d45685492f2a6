"""The remote surfaces under a hostile or buggy client: each finding of the security review, as the request or
call that exploited it, against the real gateway, service and backend on loopback, and what happens now.

vLLM is replaced by `tests.fake_vllm` (its HTTP protocol) and a step by a stand-in only where a real one
would need a GPU or a long run; the same findings on the real server and trainer are in
test_remote_backend.py. Every loop here is bounded, and every address is loopback.
"""

from __future__ import annotations

import asyncio
import base64
import errno
import json
import os
import secrets
import threading
import time
import tracemalloc
import uuid
from pathlib import Path

import httpx
import openai
import pytest
from openai.types.chat.chat_completion import Choice

import agentrl
from agentrl.backend.remote.service import BackendService, OperatorPolicy
from agentrl.backend.remote.tokens import ServiceTokens, sampling_token_for
from agentrl.foundation.config import ServerConfig
from agentrl.gateway.limits import GatewayLimits
from agentrl.gateway.serve import Gateway
from agentrl.gateway.store import SampledChoice, SampledStore
from agentrl.gateway.upstream import Replica
from tests.fake_vllm import FakeVLLM

ADMIN, SAMPLING = "admin-token-for-tests", sampling_token_for("admin-token-for-tests")


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


@pytest.fixture
async def service(tmp_path):
    """A real backend service on loopback; no model registers here (registering would start vLLM)."""
    tokens = ServiceTokens(admin=ADMIN, sampling=SAMPLING, source="test", generated=False)
    service = BackendService(tmp_path / "runs", host="127.0.0.1", port=0, tokens=tokens, policy=OperatorPolicy())
    (tmp_path / "runs").mkdir()
    await service.backend.gateway.start()
    service.url = service.backend.gateway.root_url
    yield service
    await service.backend.close()


def admin() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN}"}


# --- High 1: the service token is not a shell on the GPU host --------------------------------------------------

HOSTILE_REGISTERS = [
    ({"server": {"extra_args": ["--trust-remote-code", "--host", "0.0.0.0", "--tool-parser-plugin", "/tmp/x.py"]}},
     403, "server settings \\['extra_args'\\] differ"),
    ({"server": {"extra_args": ["--chat-template", "/etc/shadow"]}}, 403, "operator fixes the inference server"),
    ({"server": {"tool_call_parser": "/tmp/evil"}}, 403, "tool_call_parser"),
    ({"base_model": "/etc"}, 403, "base model '/etc' is not offered .* --base-model"),
    ({"base_model": "someone/remote-code-model"}, 403, "not offered"),
    ({"lora": {"rank": 4096}}, 403, "LoRA rank 4096 is above .* 64"),
    ({"base_path": "/tmp/elsewhere"}, 400, "does not take: \\['base_path'\\]"),
    ({"server_args": {"x": 1}}, 400, "does not take: \\['server_args'\\]"),
]  # fmt: skip


@pytest.mark.parametrize(("extra", "status", "message"), HOSTILE_REGISTERS)
async def test_a_register_cannot_reach_vllms_command_line_or_choose_a_base_model(service, extra, status, message):
    before = snapshot(service.runs_dir)
    body = {"model": {"name": "intruder", "project": "remote", **extra}}
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as client:
        response = await client.post("/backend/register", json=body, headers=admin())
    assert response.status_code == status, response.text
    import re

    assert re.search(message, response.json()["message"]), response.json()["message"]
    assert snapshot(service.runs_dir) == before and service.backend._engine is None  # nothing started


async def test_requests_stay_strict_and_replies_read_what_a_newer_service_adds(service):
    from agentrl.backend.remote.wire import RegisterReply

    body = {"project": "remote", "name": "agent", "surprise": 1}
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as client:
        response = await client.post("/backend/get_step", json=body, headers=admin())
    assert response.status_code == 400 and "surprise" in response.json()["message"]
    fields = {"step": 3, "service": "s", "sampling_token": "t", "base_model": "m", "added_later": True}
    reply = RegisterReply.model_validate(fields)  # a client of this version, a service of a later one
    assert reply.step == 3 and reply.spins_beside_cpu_server is False


async def test_the_sampling_token_samples_and_cannot_administer(service):
    with FakeVLLM() as upstream:
        service.backend.gateway.connect([Replica(upstream.url, "k")], context=4096)
        async with httpx.AsyncClient(base_url=service.url, timeout=30) as client:
            sampling = {"Authorization": f"Bearer {SAMPLING}"}
            chat = {"model": "agent@0", "messages": [{"role": "user", "content": "hi"}]}
            assert (await client.post("/v1/chat/completions", json=chat, headers=sampling)).status_code == 200
            assert (await client.post("/v1/chat/completions", json=chat, headers=admin())).status_code == 200
            for path in ("register", "train", "train_sft", "log", "delete_checkpoints", "get_step"):
                refused = await client.post(f"/backend/{path}", json={}, headers=sampling)
                assert refused.status_code == 403 and "may sample only" in refused.text, path
                assert (await client.post(f"/backend/{path}", json={})).status_code == 401
            assert (await client.post("/v1/chat/completions", json=chat)).status_code == 401


def test_the_sampling_token_is_derived_one_way_and_overridable(tmp_path, monkeypatch):
    from agentrl.backend.remote.tokens import service_tokens

    monkeypatch.delenv("AGENTRL_TOKEN", raising=False)
    monkeypatch.delenv("AGENTRL_SAMPLING_TOKEN", raising=False)
    tokens = service_tokens(tmp_path)
    assert tokens.generated and tokens.sampling == sampling_token_for(tokens.admin) != tokens.admin
    assert (tmp_path / "backend.token").stat().st_mode & 0o777 == 0o600
    assert tokens.admin not in repr(tokens) and tokens.sampling not in repr(tokens)
    chosen = secrets.token_urlsafe(32)
    monkeypatch.setenv("AGENTRL_SAMPLING_TOKEN", chosen)
    assert service_tokens(tmp_path).sampling == chosen and not service_tokens(tmp_path).generated
    monkeypatch.setenv("AGENTRL_SAMPLING_TOKEN", tokens.admin)
    with pytest.raises(agentrl.ConfigurationError, match="must differ"):
        service_tokens(tmp_path)


@pytest.mark.parametrize(
    ("variable", "value"),
    [("AGENTRL_TOKEN", "abc"), ("AGENTRL_TOKEN", "a" * 64), ("AGENTRL_TOKEN", "0123456789abcdef"),
     ("AGENTRL_SAMPLING_TOKEN", "sample")],
)  # fmt: skip
def test_a_weak_chosen_token_is_refused_at_start(tmp_path, monkeypatch, variable, value):
    from agentrl.backend.remote.tokens import service_tokens

    monkeypatch.delenv("AGENTRL_SAMPLING_TOKEN", raising=False)
    monkeypatch.setenv("AGENTRL_TOKEN", secrets.token_urlsafe(32))
    monkeypatch.setenv(variable, value)
    with pytest.raises(agentrl.ConfigurationError, match=f"{variable} is too weak.*token_urlsafe"):
        service_tokens(tmp_path)


def test_strong_tokens_of_every_usual_shape_pass():
    from agentrl.foundation.secret_tokens import check_token_strength

    for _ in range(200):  # the usual generators at 128 bits and up, whatever characters they happened to draw
        for token in (secrets.token_urlsafe(16), secrets.token_hex(16), secrets.token_hex(16).upper(),
                      base64.b64encode(secrets.token_bytes(16)).decode(), str(uuid.uuid4()).replace("-", "")):  # fmt: skip
            assert check_token_strength(token, "t") == token


def test_a_token_file_others_can_read_is_refused(tmp_path, monkeypatch):
    from agentrl.backend.remote.tokens import service_tokens

    monkeypatch.delenv("AGENTRL_TOKEN", raising=False)
    monkeypatch.delenv("AGENTRL_SAMPLING_TOKEN", raising=False)
    admin = service_tokens(tmp_path).admin
    (tmp_path / "backend.token").chmod(0o644)
    with pytest.raises(agentrl.ConfigurationError, match="mode is 0644 .*chmod 600"):
        service_tokens(tmp_path)
    (tmp_path / "backend.token").chmod(0o600)
    assert service_tokens(tmp_path).admin == admin
    (tmp_path / "backend.token").write_text("abc\n")
    with pytest.raises(agentrl.ConfigurationError, match="too weak"):
        service_tokens(tmp_path)


# --- Medium 2: path traversal through the split ------------------------------------------------------------------


async def test_a_split_cannot_leave_the_run_folder(service, tmp_path):
    escape = "../../../../escape/pwned"
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as client:
        body = {"model": {"project": "remote", "name": "agent"}, "groups": [], "split": escape}
        response = await client.post("/backend/log", json=body, headers=admin())
    assert response.status_code == 400 and "split '../../../../escape/pwned' must be" in response.text
    model = agentrl.TrainableModel(name="m", project="p", base_path=str(tmp_path / "local"))
    with pytest.raises(agentrl.ConfigurationError, match="split"):
        await agentrl.LocalBackend().log(model, [], escape)
    with pytest.raises(agentrl.ConfigurationError, match="split"):
        await model.log([], split=escape)  # refused on the client, before it is sent
    assert not list(tmp_path.parent.glob("**/pwned*"))


# --- Medium 3: a train request applies at most once ---------------------------------------------------------------


def stand_in_step(service: BackendService, monkeypatch, seconds: float) -> list[int]:
    """Model remote/agent at step 4 on `service`, whose steps take `seconds` (a stand-in: a real step is in
    test_remote_backend; what is tested is the service's and client's handling). Returns the steps applied."""
    service.models[("remote", "agent")] = agentrl.TrainableModel(
        name="agent", project="remote", base_path=str(service.runs_dir)
    )
    applied: list[int] = []

    async def get_step(model):
        return 4 + len(applied)

    async def train(model, groups, config, step_metrics=None, dropped=()):
        await asyncio.sleep(seconds)
        applied.append(4 + len(applied) + 1)
        return agentrl.TrainResult(step=applied[-1], metrics={"loss": 0.1})

    monkeypatch.setattr(service.backend, "get_step", get_step)
    monkeypatch.setattr(service.backend, "train", train)
    return applied


async def test_a_retried_or_stale_step_request_is_applied_once(service, monkeypatch):
    applied = stand_in_step(service, monkeypatch, seconds=0.3)  # long enough for a retry to arrive while it runs
    request = {"model": {"project": "remote", "name": "agent"}, "groups": [], "config": {},
               "request_id": "first-attempt-0001", "from_step": 4}  # fmt: skip
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as client:
        post = lambda body: client.post("/backend/train", json=body, headers=admin())  # noqa: E731
        first, retry = await asyncio.gather(post(request), post(request))  # a retry while the first runs
        late_retry = await post(request)  # and one after it finished
        assert [r.json()["step"] for r in (first, retry, late_retry)] == [5, 5, 5] and applied == [5]
        other = await post({**request, "request_id": "other-client-0002"})  # another client, made at step 4
        assert other.status_code == 409 and other.json()["type"] == "StepConflictError"
        assert "at step 5, but this request was made at step 4" in other.json()["message"] and applied == [5]
        fresh = await post({**request, "request_id": "next-step-00003", "from_step": 5})
        assert fresh.json()["step"] == 6 and applied == [5, 6]


async def test_a_remote_backend_asks_again_for_a_lost_answer_and_the_step_applies_once(service, monkeypatch):
    # The step outlasts the client's wait for an answer (1 s) and ends before its first retry (after 1 s more);
    # that wait is also get_step's, so it must hold under a loaded machine (0.2 s did not, once).
    applied = stand_in_step(service, monkeypatch, seconds=1.5)
    model = service.models[("remote", "agent")]
    async with agentrl.RemoteBackend(service.url, token=ADMIN, timeout_s=1.0, step_retries=3) as backend:
        assert await backend.get_step(model) == 4
        result = await backend.train(model, [], agentrl.TrainConfig())
    assert result.step == 5 and applied == [5]


# --- Medium 5: a partial adapter load across replicas --------------------------------------------------------------


async def test_a_failed_load_on_one_replica_is_unloaded_from_all_and_a_retry_loads(tmp_path):
    from agentrl.backend.serving.replicas import ServerReplicas
    from agentrl.backend.serving.server import VLLMServer

    class Running(VLLMServer):
        def death_notice(self):
            return None

    with FakeVLLM() as good, FakeVLLM(fail_loads=True) as bad:
        replicas = ServerReplicas.__new__(ServerReplicas)  # its servers are these two, not ones it would start
        replicas.replicas, replicas.adapters, replicas._changing = [], {}, asyncio.Lock()
        for fake in (good, bad):
            server = Running("model", tmp_path / "log", ServerConfig(), max_lora_rank=8)
            server.port, server.api_key = fake.port, "k"
            replicas.replicas.append(server)
        with pytest.raises(agentrl.ServerError, match="failed with 500"):
            await replicas.load_adapter("agent@3", tmp_path)
        assert good.loaded == set() and bad.loaded == set()  # not left served under the rolled-back name
        bad.fail_loads = False
        await replicas.load_adapter("agent@3", tmp_path)  # no "already loaded" on the retry
        assert good.loaded == bad.loaded == {"agent@3"}
        assert replicas.adapters == {"agent@3": tmp_path}  # what a replica joining from another host gets first


# --- Medium 6 and 7, low items: the gateway's bounds and its own completion ids ----------------------------------


async def bounded_gateway():
    """A gateway with small bounds in front of a fake vLLM (`.fake`), and a client with the sampling token."""
    with FakeVLLM() as upstream:
        gateway = Gateway(token=SAMPLING, limits=GatewayLimits(max_body_bytes=1 << 20, max_in_flight_per_replica=2))
        await gateway.start()
        gateway.connect([Replica(upstream.url, "k")], context=4096)
        gateway.fake = upstream
        gateway.client = httpx.AsyncClient(
            base_url=gateway.base_url, headers={"Authorization": f"Bearer {SAMPLING}"}, timeout=30
        )
        yield gateway
        await gateway.client.aclose()
        await gateway.stop()


gateway = pytest.fixture(bounded_gateway)
refusing_gateway = pytest.fixture(scope="module")(bounded_gateway)
"""One for the module's requests that must be refused before vLLM sees them (a stop takes ~0.3 s; 13 of them)."""


CHAT = {"model": "agent@2", "messages": [{"role": "user", "content": "hi"}]}
REFUSED = [
    ({**CHAT, "n": 100000}, "`n` is 100000; this gateway takes 1 to 64"),
    ({**CHAT, "best_of": 10**6}, "`best_of` is 1000000"),
    ({**CHAT, "max_tokens": 10**12}, "`max_tokens` is 1000000000000; this gateway takes 1 to 4096"),
    ({**CHAT, "max_completion_tokens": 0}, "`max_completion_tokens` is 0"),
    ({**CHAT, "top_logprobs": 100000}, "`top_logprobs` is 100000; this gateway takes 0 to 20"),
    ({**CHAT, "prompt_logprobs": 5000}, "`prompt_logprobs` is 5000"),
    ({**CHAT, "logprobs": 5}, "`logprobs` of a chat completion must be true or false"),
    ({**CHAT, "n": "3"}, "`n` must be a whole number"),
    ({**CHAT, "stream": "false"}, "`stream` must be true or false"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "message"), REFUSED)
async def test_sizes_past_the_bounds_are_refused_before_vllm_sees_them(refusing_gateway, body, message):
    response = await refusing_gateway.client.post("/chat/completions", json=body)
    assert response.status_code == 400 and message in response.json()["error"]["message"]
    assert refusing_gateway.fake.received == []


async def test_a_text_completions_logprobs_are_bounded_too(gateway):
    body = {"model": "agent@2", "prompt": "hi", "logprobs": 1000}
    response = await gateway.client.post("/completions", json=body)
    assert response.status_code == 400 and "`logprobs` is 1000" in response.text


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"[" * 200_000 + b"]" * 200_000, "nested too deeply"),
        (b'{"model": "\xff\xfe"}', "UTF-8"),
        (b"not json", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
    ],  # fmt: skip
)
async def test_malformed_bodies_get_a_400_not_a_reset_connection(refusing_gateway, content, message):
    response = await refusing_gateway.client.post("/chat/completions", content=content)
    assert response.status_code == 400 and message in response.json()["error"]["message"]


async def test_an_oversized_body_is_refused_while_it_streams_and_memory_stays_bounded(gateway):
    chunk = b" " * (1 << 20)

    async def body():  # 32 MiB, chunked: no length declared up front
        for _ in range(32):
            yield chunk

    tracemalloc.start()
    try:
        response = await gateway.client.post("/chat/completions", content=body())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert response.status_code == 413 and "over 1048576 bytes" in response.json()["error"]["message"]
    print(f"\npeak traced memory while refusing a 32 MiB body: {peak / 2**20:.1f} MiB")
    assert peak < 8 * 2**20  # the limit (1 MiB) and a few chunks, not the body
    declared = await gateway.client.post("/chat/completions", content=b"{}" + b" " * (2 << 20))  # Content-Length
    assert declared.status_code == 413 and "this gateway takes at most 1048576" in declared.text


async def test_requests_past_the_in_flight_bound_get_429_and_retry_later(gateway):
    gateway.fake.delay_s = 1.0
    responses = await asyncio.gather(*(gateway.client.post("/chat/completions", json=CHAT) for _ in range(3)))
    assert sorted(r.status_code for r in responses) == [200, 200, 429]
    assert "every inference server has 2 requests in flight" in next(r for r in responses if r.status_code == 429).text
    assert gateway.upstream.replicas[0].in_flight == 0


async def test_the_gateway_names_every_completion_so_clients_cannot_overwrite_each_others_tokens(gateway):
    victim = await gateway.client.post("/chat/completions", json={**CHAT, "request_id": "known-id"})
    attacker = await gateway.client.post("/chat/completions", json={**CHAT, "request_id": "known-id", "n": 3})
    ids = victim.json()["id"], attacker.json()["id"]
    assert ids[0] != ids[1] and "known-id" not in "".join(ids)
    assert [b["request_id"] for b in gateway.fake.received] != ["known-id", "known-id"]
    assert gateway.store.get(ids[0])[0].token_ids == [10, 11] and len(gateway.store.get(ids[1])) == 3


async def test_an_abandoned_request_stops_generating_upstream(gateway):
    gateway.fake.delay_s = 20.0
    with pytest.raises(httpx.ReadTimeout):
        await gateway.client.post("/chat/completions", json=CHAT, timeout=0.5)
    for _ in range(100):  # bounded: 5 s
        if gateway.fake.aborted:
            break
        await asyncio.sleep(0.05)
    assert gateway.fake.aborted == 1 and gateway.fake.finished == 0
    assert gateway.upstream.replicas[0].in_flight == 0


def test_the_store_keeps_one_prompt_for_n_choices_and_never_an_entry_past_its_bound():
    store = SampledStore(max_tokens=1000)
    prompt = list(range(100))
    store.put("a", [SampledChoice(prompt_token_ids=prompt, token_ids=[1, 2], logprobs=[-0.1, -0.2])] * 8)
    assert store.num_tokens == 100 + 8 * 2  # not 8 x 102
    assert [c.prompt_token_ids for c in store.get("a")] == [prompt] * 8
    store.put("huge", [SampledChoice(prompt_token_ids=list(range(2000)), token_ids=[1], logprobs=[-0.1])])
    assert len(store) == 1 and store.num_tokens == 116  # the oversized entry is not kept, the others stay


# --- Medium 8: token ids out of the vocabulary ---------------------------------------------------------------------


@pytest.mark.parametrize("bad_id", [10**12, -7, 49152])
def test_token_ids_outside_the_vocabulary_are_refused_naming_the_trajectory(bad_id):
    from agentrl.rl.tokenize import check_token_ids, labelled_histories
    from tests.helpers import make_choice

    good = agentrl.Trajectory(messages_and_choices=[{"role": "user", "content": "hi"}, make_choice([5, 6])], reward=0)
    bad = agentrl.Trajectory(
        messages_and_choices=[{"role": "user", "content": "hi"}, make_choice([5, bad_id])], reward=1
    )
    groups = [agentrl.TrajectoryGroup([good, good]), agentrl.TrajectoryGroup([good, bad])]
    with pytest.raises(agentrl.TokenizationError, match=f"group 1, trajectory 1, assistant turn 0: token id {bad_id}"):
        check_token_ids(labelled_histories(groups), 49152)
    check_token_ids(labelled_histories(groups[:1]), 49152)


# --- Low items --------------------------------------------------------------------------------------------------


async def test_a_local_backends_gateway_always_has_a_token():
    backend = agentrl.LocalBackend()
    assert backend.gateway.token and len(backend.gateway.token) >= 32
    await backend.gateway.start()
    try:
        async with httpx.AsyncClient(timeout=30) as client:
            assert (await client.get(f"{backend.gateway.base_url}/models")).status_code == 401
            good = {"Authorization": f"Bearer {backend.gateway.token}"}
            assert (await client.get(f"{backend.gateway.base_url}/models", headers=good)).status_code == 200
    finally:
        await backend.close()


def test_reprs_show_no_token():
    from agentrl.foundation.endpoint import InferenceEndpoint

    assert "s3cret" not in repr(InferenceEndpoint("http://h/v1", "s3cret"))
    assert "s3cret" not in repr(agentrl.RemoteBackend("http://h:8000", token="s3cret"))


def test_the_vllm_process_gets_no_secret_of_this_environment(monkeypatch):
    from agentrl.backend.serving.server import server_env

    for name in (
        "WANDB_API_KEY",
        "HF_TOKEN",
        "AWS_SECRET_ACCESS_KEY",
        "OPENAI_API_KEY",
        "AGENTRL_TOKEN",
        "MY_PASSWORD",
        "AZURE_OPENAI_KEY",
        "SSH_AUTH_SOCK",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "SENTRY_DSN",
        "GITHUB_PAT",
        "DB_PASS",
        "anthropic_api_key",
        "MY_SERVICE_APIKEY",
    ):
        monkeypatch.setenv(name, "secret-value")
    for name, value in {"HF_HOME": "/cache", "PWD": "/work", "KEYBOARD_LAYOUT": "us", "OMP_NUM_THREADS": "2",
                        "HTTPS_PROXY": "http://proxy:3128", "SSL_CERT_FILE": "/etc/ssl/cert.pem"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    env = server_env(ServerConfig(), gpu=False, api_key="server-key")
    assert "secret-value" not in env.values() and env["VLLM_API_KEY"] == "server-key"
    assert (env["HF_HOME"], env["PWD"], env["KEYBOARD_LAYOUT"], env["HTTPS_PROXY"]) == (
        "/cache", "/work", "us", "http://proxy:3128")  # fmt: skip


def test_rank_sockets_stay_on_loopback_unless_the_user_chose(monkeypatch):
    from agentrl.backend.training.ranks.rank_process import keep_rank_sockets_on_loopback

    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "eth7")
    keep_rank_sockets_on_loopback()
    assert os.environ["GLOO_SOCKET_IFNAME"] == "lo" and os.environ["NCCL_SOCKET_IFNAME"] == "eth7"


def test_an_atomic_write_that_fails_leaves_no_temp_file_and_the_old_content(tmp_path, monkeypatch):
    from agentrl.foundation import files

    path = tmp_path / "metrics.json"
    files.write_text_atomic(path, "old")
    synced = []
    monkeypatch.setattr(files, "fsync_path", lambda p: synced.append(Path(p)))
    files.write_text_atomic(path, "new")
    assert synced == [tmp_path] and path.read_text() == "new"  # the folder's entry is flushed too

    def full_disk(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space"):
        files.write_text_atomic(path, "newer")
    assert path.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["metrics.json"]


def test_a_file_system_without_locks_is_named_and_leaks_no_descriptor(tmp_path, monkeypatch):
    import fcntl

    from agentrl.backend.run_lock import RunLock

    def unsupported(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", unsupported)
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(agentrl.ConfigurationError, match="does not support file locks .* local disk"):
        RunLock(tmp_path / "run").acquire()
    assert len(os.listdir("/proc/self/fd")) == before


def test_run_folders_are_private_to_their_user(tmp_path):
    from agentrl.backend.run_lock import RunLock

    lock = RunLock(tmp_path / "runs" / "project" / "name")
    lock.acquire()
    lock.acquire()  # again: nothing to do, no second descriptor
    lock.release()
    for folder in ("runs", "runs/project", "runs/project/name"):
        assert (tmp_path / folder).stat().st_mode & 0o777 == 0o700, folder
    assert (tmp_path / "runs/project/name/.lock").stat().st_mode & 0o777 == 0o600


async def test_nan_step_metrics_are_refused(service):
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as client:
        body = '{"model": {"project": "p", "name": "n"}, "groups": [], "config": {}, "step_metrics": {"x": NaN}}'
        response = await client.post("/backend/train", content=body, headers=admin())
    assert response.status_code == 400 and "finite" in response.text
    model = agentrl.TrainableModel(name="m", project="p")
    with pytest.raises(agentrl.ConfigurationError, match="not finite"):
        await agentrl.LocalBackend().train(model, [], agentrl.TrainConfig(), step_metrics={"x": float("nan")})


async def test_a_backend_body_past_its_bound_is_refused(tmp_path):
    tokens = ServiceTokens(admin=ADMIN, sampling=SAMPLING, source="test", generated=False)
    service = BackendService(
        tmp_path, host="127.0.0.1", port=0, tokens=tokens, limits=GatewayLimits(max_backend_body_bytes=1000)
    )
    await service.backend.gateway.start()
    try:
        async with httpx.AsyncClient(base_url=service.backend.gateway.root_url, timeout=30) as client:
            body = {"model": {"project": "p", "name": "n"}, "groups": [], "split": "val" + " " * 2000}
            response = await client.post("/backend/log", content=json.dumps(body), headers=admin())
        assert response.status_code == 413 and "at most 1000" in response.text
    finally:
        await service.backend.close()


# --- capture: only trained adapters, only inside the block, and threads -------------------------------------------


async def test_capture_records_the_adapter_only_inside_the_block_and_from_a_lone_thread(gateway):
    import openai

    client = openai.AsyncOpenAI(base_url=gateway.base_url, api_key=SAMPLING)
    sync_client = openai.OpenAI(base_url=gateway.base_url, api_key=SAMPLING)
    ask = lambda model: client.chat.completions.create(model=model, messages=CHAT["messages"])  # noqa: E731
    started = threading.Event()
    with agentrl.capture_trajectory() as trajectory:
        await ask("agent@2")
        await ask("base")  # a judge or baseline on the same gateway: not a training history
        await ask("judge-provider-model")  # no "@step": not a trained adapter
        await asyncio.get_running_loop().run_in_executor(
            None,
            lambda: sync_client.chat.completions.create(model="agent@2", messages=[{"role": "user", "content": "x"}]),
        )  # a thread without the block's context: the only open capture takes it

        async def outlives_the_block():
            started.set()
            await asyncio.sleep(0.2)
            await ask("agent@2")

        straggler = asyncio.ensure_future(outlives_the_block())
        await asyncio.sleep(0.01)
    await straggler  # its call came after the block: not recorded
    assert len(trajectory.choices()) == 1 and len(trajectory.additional_histories) == 1
    assert all(c.model_extra["policy_step"] == 2 for h in trajectory.histories() for c in h.choices())
    with agentrl.capture_trajectory(model="other") as other:
        await ask("agent@2")
    assert other.messages_and_choices == []
    await client.close()
    sync_client.close()


# --- Medium 4: failures after the update ---------------------------------------------------------------------------


async def test_a_failure_after_the_update_rolls_back_and_a_committed_step_is_reported(
    tiny_model_path, tokenizer, tmp_path
):
    """The real trainer (on the tiny model: the step's outcome is what counts) and checkpoints; the server
    is the seam (waking after a step exists on a GPU only)."""
    import torch

    from agentrl.records.checkpoints import OPTIMIZER_FILE
    from tests.helpers import model_on_a_server_seam, synthetic_groups

    class GPUServer:
        """The servers of a GPU host: asleep while the trainer trains; waking can fail."""

        devices, wake_fails, loaded = 1, True, []

        async def sleep(self, level: int = 1) -> None: ...

        async def wake_up(self) -> None:
            if self.wake_fails:
                raise agentrl.ServerError("POST /wake_up failed with 500")

        async def load_adapter(self, name, path) -> None:
            self.loaded.append(name)

        async def unload_adapter(self, name) -> None: ...

        def death_notice(self) -> None:
            return None

    server = GPUServer()
    session = model_on_a_server_seam(tiny_model_path, tmp_path, server, trainer_device="cuda:0")
    model, trainer, store, lock = session.model, session.trainer, session.store, session.lock
    before = trainer.adapter_weights("default")
    groups = synthetic_groups(tokenizer, seed=0, size=2, max_words=8)  # small: the step's outcome is what counts
    config = agentrl.TrainConfig(learning_rate=1e-3)

    with pytest.raises(
        agentrl.ServerError, match="Nothing of this step was applied: the trainer is back at checkpoint 0"
    ):
        await model.train(groups, config)
    after = trainer.adapter_weights("default")
    assert all(torch.equal(before[k], after[k]) for k in before) and store.steps() == [0]

    server.wake_fails = False
    (model.run_dir / "metrics.jsonl").mkdir()  # recording will fail: a folder where the metrics file goes
    result = await model.train(groups, config)  # the retry applies one step, not two
    assert result.step == 1 and not result.skipped and store.steps() == [0, 1]
    assert result.record_error and "step 1 is done, but recording its metrics failed" in result.record_error
    state = torch.load(store.path(1) / OPTIMIZER_FILE, weights_only=False)["state"]
    assert {float(moments["step"]) for moments in state.values()} == {1.0}  # one optimizer step in the checkpoint
    assert server.loaded == ["m@1"]
    lock.release()


@pytest.mark.parametrize("content", [b"[" * 200_000 + b"]" * 200_000, b'{"model": "\xff\xfe"}', b"{" * 5000])
async def test_malformed_backend_bodies_get_a_400(service, content):
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as client:
        response = await client.post("/backend/register", content=content, headers=admin())
    assert response.status_code == 400, response.text


# --- Low 6: abandoned bodies and cut streams ----------------------------------------------------------------------


async def _raw_request(port: int, head: bytes, body: bytes, *, hang_up: bool, wait_s: float = 10) -> bytes:
    """Send a request's head and part of its body over a raw connection; hang up, or read what comes back."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head + body)
    await writer.drain()
    if hang_up:
        writer.close()
        return b""
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), wait_s)
        length = next(
            int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
        )
        return head + await asyncio.wait_for(reader.readexactly(length), wait_s)
    finally:
        writer.close()


async def test_abandoned_and_stalled_bodies_are_let_go_quietly(capfd):
    with FakeVLLM() as upstream:
        gateway = Gateway(token=SAMPLING, limits=GatewayLimits(body_timeout_s=0.5))
        await gateway.start()
        gateway.connect([Replica(upstream.url, "k")], context=4096)
        head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {SAMPLING}\r\n"
                "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n").encode()  # fmt: skip
        try:
            for _ in range(30):  # clients that hang up mid-body
                await _raw_request(gateway.port, head, b'{"model"', hang_up=True)
            started = time.monotonic()
            stalled = await asyncio.gather(
                *(_raw_request(gateway.port, head, b'{"model"', hang_up=False) for _ in range(20))
            )  # clients that send 8 of 1,000 bytes and wait
            assert time.monotonic() - started < 5
            for answer in stalled:
                assert answer.startswith(b"HTTP/1.1 408") and b"no part of the request body arrived" in answer
            assert upstream.received == []
        finally:
            await gateway.stop()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "ClientDisconnect" not in err, err[-3000:]


STREAMED = {
    "chat": ("/chat/completions", {**CHAT, "stream": True}),
    "responses": ("/responses", {"model": "agent@2", "input": "hi", "stream": True}),
    "messages": ("/messages", {"model": "agent@2", "max_tokens": 8, "stream": True,
                               "messages": [{"role": "user", "content": "hi"}]}),
}  # fmt: skip


@pytest.mark.parametrize("api", sorted(STREAMED))
async def test_a_stream_cut_by_a_dying_replica_ends_with_an_error_event_and_is_never_trained(api):
    from agentrl.backend.sampled_tokens import fill_sampled_tokens

    path, body = STREAMED[api]
    with FakeVLLM(cut_streams_after=2) as upstream:
        gateway = Gateway(token=SAMPLING)
        await gateway.start()
        gateway.connect([Replica(upstream.url, "k")], context=4096)
        headers = {"Authorization": f"Bearer {SAMPLING}", "x-api-key": SAMPLING}
        try:
            async with httpx.AsyncClient(base_url=gateway.base_url, headers=headers, timeout=30) as client:
                async with client.stream("POST", path, json=body) as response:
                    frames = [frame async for frame in response.aiter_text()]
            events = "".join(frames).strip().split("\n\n")
            last = json.loads(events[-1].split("data: ", 1)[1])
            assert "stream broke off mid-answer" in json.dumps(last), events[-1]
            if api != "chat":
                assert events[-1].startswith("event: error")
            completion_id = gateway_id(events)
            (kept,) = gateway.store.get(completion_id)
            assert kept.token_ids == [20, 21] and kept.incomplete  # two of three tokens, marked
            choice = Choice.model_validate({"index": 0, "finish_reason": "stop", "completion_id": completion_id,
                                            "message": {"role": "assistant", "content": "t0 t1"}})  # fmt: skip
            group = agentrl.TrajectoryGroup([agentrl.Trajectory(messages_and_choices=[choice], reward=1.0)])
            with pytest.raises(agentrl.TokenizationError, match="cut off mid-stream"):
                fill_sampled_tokens([group], gateway.store)
        finally:
            await gateway.stop()


def gateway_id(events: list[str]) -> str:
    """The id a stream's answer is kept under, from its opening event (a chat chunk, a response, a message)."""
    opening = json.loads(events[0].split("data: ", 1)[1])
    if "choices" in opening:
        return opening["choices"][0]["completion_id"]
    return (opening.get("response") or opening.get("message"))["id"]


async def test_the_openai_client_raises_on_a_cut_stream():
    with FakeVLLM(cut_streams_after=1) as upstream:
        gateway = Gateway(token=SAMPLING)
        await gateway.start()
        gateway.connect([Replica(upstream.url, "k")], context=4096)
        try:
            client = openai.AsyncOpenAI(base_url=gateway.base_url, api_key=SAMPLING, max_retries=0)
            stream = await client.chat.completions.create(**{**CHAT, "stream": True})
            with pytest.raises(openai.APIError, match="stream broke off mid-answer"):
                async for _ in stream:
                    pass
        finally:
            await gateway.stop()


# --- 7: bounds on what the gateway and a checkpoint's records may hold --------------------------------------------


def test_response_threads_are_bounded_in_bytes_as_well_as_in_number():
    from agentrl.gateway.responses_api import ResponseThreads

    threads = ResponseThreads(max_responses=1000, max_bytes=100_000)
    message = [{"role": "user", "content": "x" * 10_000}]
    for index in range(50):
        threads.put(f"resp_{index}", message)
    assert threads.num_bytes <= 100_000 and threads.get("resp_49") == message and threads.get("resp_0") is None
    threads.put("resp_huge", [{"role": "user", "content": "x" * 200_000}])  # larger than the whole bound: not kept
    assert threads.get("resp_huge") is None and threads.get("resp_49") == message


def test_a_session_past_its_bound_or_dropped_says_so_when_it_closes():
    from agentrl.gateway.sessions import SessionLog

    log = SessionLog(max_open=3, max_bytes_per_session=10_000)
    big = log.open()
    assert log.record(big, {"messages": "x" * 4000}, {"id": 1}) and log.record(big, {"messages": "x" * 4000}, {"id": 2})
    assert not log.record(big, {"messages": "x" * 4000}, {"id": 3})  # past 10,000 bytes: ended
    with pytest.raises(agentrl.SessionOverflowError, match="passed 10000 bytes"):
        log.close(big)
    forgotten, *others = [log.open() for _ in range(4)]  # one more than may be open: the oldest goes
    assert not log.is_open(forgotten) and all(log.is_open(s) for s in others)
    with pytest.raises(agentrl.SessionOverflowError, match="more than 3 rollout sessions were open at once"):
        log.close(forgotten)
    assert log.record(others[0], {"m": 1}, {"id": 1}) and log.close(others[0]) == [({"m": 1}, {"id": 1})]


def test_a_step_input_that_inflates_without_bound_is_refused(tmp_path, monkeypatch):
    import gzip

    from agentrl.backend.training import step_input
    from agentrl.records import checkpoints

    monkeypatch.setattr(step_input, "MAX_RECORD_BYTES", 1_000_000)
    (tmp_path / checkpoints.STEP_INPUT_FILE).write_bytes(gzip.compress(b"\n" * 5_000_000))  # 5 MB from ~5 kB
    assert (tmp_path / checkpoints.STEP_INPUT_FILE).stat().st_size < 20_000
    with pytest.raises(agentrl.CheckpointError, match="inflates past 1000000 bytes"):
        step_input.read_step_input(tmp_path)
