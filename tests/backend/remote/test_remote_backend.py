"""RemoteBackend against `agentrl backend serve` in another process: real HTTP, real vLLM, real trainer.

One service process for the module (restarted once, on the same port and runs folder, the second time
with --pipelined); client
processes train on it as a notebook on a laptop would train on a GPU host.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

import agentrl
from agentrl.backend.processes import free_port
from agentrl.backend.serving.zygote import ZYGOTE_ENV

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.slow  # a service with its own vLLM server and trainer


class Service:
    """`agentrl backend serve` as a subprocess, its stdout collected."""

    def __init__(self, runs: Path, port: int) -> None:
        self.runs, self.port = runs, port
        self.url = f"http://127.0.0.1:{port}"
        self.process: subprocess.Popen[str] | None = None

    def start(self, *options: str) -> str:
        """Start it and wait until it listens; returns what it printed (its output goes to a file, never a full pipe)."""
        # Without the suite's vLLM zygote: the service's servers are its own children (`vllm_processes`), and
        # the suite keeps a real test of servers started as their own Python. OpenMP's spin is libgomp's own
        # unless an option bounds it.
        dropped = ("AGENTRL_TOKEN", ZYGOTE_ENV, "GOMP_SPINCOUNT", "OMP_WAIT_POLICY")
        env = {k: v for k, v in os.environ.items() if k not in dropped}
        log = self.runs.parent / f"service-{time.monotonic_ns()}.log"
        command = [sys.executable, "-m", "agentrl.cli", "backend", "serve", *options, "--port", str(self.port)]
        with open(log, "w") as out:
            self.process = subprocess.Popen(
                [*command, "--runs", str(self.runs)], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, text=True
            )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and self.process.poll() is None:
            if "agentrl backend serving at" in (output := log.read_text()):
                return output
            time.sleep(0.2)
        raise AssertionError(f"the service did not start:\n{log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=60)
            self.process = None


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    service = Service(tmp_path_factory.mktemp("service-runs"), free_port())
    first_output = service.start()
    service.first_output = first_output
    yield service
    service.stop()


@pytest.fixture
def token(service) -> str:
    return (service.runs / "backend.token").read_text().strip()


def run_client(service: Service, token: str, name: str, steps: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "remote_client.py"), service.url, name, str(steps)],
        cwd=ROOT,
        env={**os.environ, "AGENTRL_TOKEN": token},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


def test_the_token_is_generated_once_kept_private_and_never_printed(service, token):
    assert "generated an admin token" in service.first_output and "0600" in service.first_output
    assert token not in service.first_output  # a terminal's scrollback or a log is no place for it
    assert (service.runs / "backend.token").stat().st_mode & 0o777 == 0o600


ROUTES = [("GET", "/health"), ("GET", "/v1/models"), ("POST", "/v1/chat/completions"), ("POST", "/v1/completions"),
          ("GET", "/v1/sampled/x"), ("POST", "/backend/register"), ("POST", "/backend/get_step"),
          ("POST", "/backend/train"), ("POST", "/backend/train_sft"), ("POST", "/backend/log"),
          ("POST", "/backend/delete_checkpoints"), ("POST", "/v1/load_lora_adapter"), ("POST", "/v1/responses"),
          ("POST", "/v1/messages"), ("POST", "/v1/sessions/x/responses"), ("POST", "/backend/open_session"),
          ("POST", "/backend/close_session")]  # fmt: skip


async def test_without_the_token_every_route_answers_401_and_nothing_changes(service, token):
    before = snapshot(service.runs)
    body = {"model": {"name": "intruder", "project": "remote"}}
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as client:
        for method, path in ROUTES:
            wrong = ({}, {"Authorization": "Bearer wrong"}, {"x-api-key": "wrong"}, {"Authorization": token})
            for headers in wrong:  # a token without its scheme is refused too
                response = await client.request(method, path, headers=headers, json=body)
                assert response.status_code == 401, (path, headers, response.text)
    assert snapshot(service.runs) == before
    backend = agentrl.RemoteBackend(service.url, token="wrong")
    with pytest.raises(agentrl.ConfigurationError, match="refused the token"):
        await agentrl.TrainableModel(name="intruder", project="remote").register(backend)
    await backend.close()
    with pytest.raises(agentrl.ConfigurationError, match="needs the service's token"):
        agentrl.RemoteBackend(service.url, token="")


def test_a_client_process_trains_several_steps_on_the_service(service, token):
    client = run_client(service, token, "agent", 2)
    output, _ = client.communicate(timeout=600)
    assert client.returncode == 0, output[-3000:]
    assert "REGISTERED agent@0" in output and "STEP 1 agent@1" in output and "STEP 2 agent@2" in output
    run = service.runs / "remote" / "agent"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["0000", "0001", "0002"]
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2
    served = httpx.get(f"{service.url}/v1/models", headers={"Authorization": f"Bearer {token}"}).json()
    assert {"agent@2", "base"} <= {m["id"] for m in served["data"]}


async def test_a_client_killed_mid_train_leaves_a_whole_step_and_a_new_client_continues(service, token):
    client = run_client(service, token, "agent", 1)
    assert client.stdout is not None
    for line in client.stdout:
        if line.startswith("TRAINING"):
            break
    time.sleep(0.5)  # the train request is on its way or being served
    client.kill()
    client.wait()

    model = agentrl.TrainableModel(name="agent", project="remote")
    backend = agentrl.RemoteBackend(service.url, token=token)
    await asyncio.wait_for(model.register(backend), timeout=300)  # waits for a step in progress
    step = await model.get_step()
    run = service.runs / "remote" / "agent"
    print(f"\nafter the kill the run is at step {step} (2 before it)")
    assert step in (2, 3)
    assert max(int(p.name) for p in (run / "checkpoints").iterdir() if p.name.isdigit()) == step
    assert not list((run / "checkpoints").glob(".staging-*"))
    assert len((run / "metrics.jsonl").read_text().splitlines()) == step
    served = {m["id"] for m in (await backend._client.get("/v1/models")).json()["data"]}
    assert f"agent@{step}" in served and f"agent@{step - 2}" not in served
    await backend.close()

    client = run_client(service, token, "agent", 1)
    output, _ = client.communicate(timeout=600)
    assert client.returncode == 0 and f"STEP {step + 1} agent@{step + 1}" in output, output[-3000:]


async def test_after_a_restart_the_client_is_told_and_continues_after_register(service, token, caplog):
    from tests.remote_client import sampled_answer

    async def one_pipelined_step(model: agentrl.TrainableModel) -> agentrl.TrainResult:
        def make_groups(model: agentrl.TrainableModel, step: int) -> list[agentrl.TrajectoryGroup]:
            return [agentrl.TrajectoryGroup(sampled_answer(model, r) for r in (0.0, 1.0)) for _ in range(2)]

        config = agentrl.TrainConfig(learning_rate=1e-3)
        return (await agentrl.train_pipelined(model, make_groups, steps=1, config=config))[0]

    model = agentrl.TrainableModel(name="agent", project="remote")
    backend = agentrl.RemoteBackend(service.url, token=token)
    await model.register(backend)
    # The service trains and serves on this CPU with libgomp's own spin: a pipelined client is told the fix.
    assert "agentrl backend serve --pipelined" in (backend.pipelined_spin_fix() or "")
    step = (await one_pipelined_step(model)).step
    assert "agentrl backend serve --pipelined" in caplog.text
    service.stop()
    with pytest.raises(agentrl.ServerError, match="cannot reach the agentrl backend"):
        await model.get_step()
    assert "generated a token" not in service.start("--pipelined")  # the saved token is reused
    with pytest.raises(agentrl.ServerError, match="restarted .* register"):
        await model.get_step()
    await model.register(backend)
    assert await model.get_step() == step and model.inference_name == f"agent@{step}"
    # --pipelined bounded the spin in the service and the server it started, and the client heard so at register.
    assert backend.pipelined_spin_fix() is None
    assert [p.environ().get("GOMP_SPINCOUNT") for p in vllm_processes(service)] == ["2000"]
    caplog.clear()
    result = await one_pipelined_step(model)
    assert "GOMP_SPINCOUNT" not in caplog.text
    assert result.step == step + 1 and model.inference_name == f"agent@{step + 1}"
    assert (service.runs / "remote" / "agent" / "checkpoints" / f"{step + 1:04d}").is_dir()
    await backend.close()


def vllm_processes(service: Service) -> list:
    import psutil

    children = psutil.Process(service.process.pid).children(recursive=True)
    return [p for p in children if "agentrl_vllm.api_server" in " ".join(p.cmdline())]


@pytest.fixture
async def agent(service, token):
    """The module's model remote/agent, registered through a RemoteBackend of its own."""
    model = agentrl.TrainableModel(name="agent", project="remote")
    backend = agentrl.RemoteBackend(service.url, token=token)
    await model.register(backend)
    yield model
    await backend.close()


async def test_rollouts_get_the_sampling_token_which_cannot_train(service, token, agent):
    from tests.remote_client import sampled_group

    model, backend = agent, agent.backend
    assert backend.sampling_token != token and model.litellm_params()["api_key"] == backend.sampling_token
    group = await sampled_group(model)  # the rollout's client holds the sampling token: it samples
    assert group.trajectories[0].choices()[0].model_extra["token_ids"]
    async with agentrl.RemoteBackend(service.url, token=backend.sampling_token) as leaked:  # a rollout's token
        with pytest.raises(agentrl.ConfigurationError, match="sampling token, which cannot train"):
            await leaked.register(agentrl.TrainableModel(name="agent", project="remote"))
    with pytest.raises(agentrl.NotAllowedError, match="base model 'gpt2' is not offered"):
        await agentrl.TrainableModel(name="other", project="remote", base_model="gpt2").register(backend)


async def test_a_session_url_on_the_service_records_a_rollout_that_trains_there(service, token, agent):
    """`model.session()` on a RemoteBackend: the service's gateway logs the rollout (Responses, then chat),
    the session closes with the block, and the trajectory trains on the service's exact tokens."""
    import openai

    model = agent

    async def rollout(reward: float) -> agentrl.Trajectory:
        async with model.session() as session:
            assert session.base_url.startswith(f"{service.url}/v1/sessions/") and session.api_key != token
            client = openai.AsyncOpenAI(base_url=session.base_url, api_key=session.api_key)
            first = await client.responses.create(model=session.model, input="Name a colour.", max_output_tokens=8)
            conversation = [
                {"role": "user", "content": "Name a colour."},
                {"role": "assistant", "content": first.output_text},
                {"role": "user", "content": "Another one."},
            ]
            await client.chat.completions.create(model=session.model, messages=conversation, max_tokens=8)
        trajectory = session.trajectory
        assert [m["role"] for m in trajectory.messages()] == ["user", "assistant", "user", "assistant"]
        with pytest.raises(openai.NotFoundError, match="closed or unknown"):
            await client.chat.completions.create(model=session.model, messages=conversation, max_tokens=2)
        trajectory.reward = reward
        return trajectory

    step = await model.get_step()
    trajectories = await asyncio.gather(rollout(0.0), rollout(1.0), rollout(0.0), rollout(1.0))
    trained, dropped = agentrl.TrajectoryGroup(trajectories[:2]), agentrl.TrajectoryGroup(trajectories[2:])
    result = await model.train([trained], agentrl.TrainConfig(learning_rate=1e-5), dropped=[dropped])
    assert not result.skipped and result.step == step + 1 and result.metrics["trained_tokens"] > 0
    # Every turn (Responses, then chat) trained in the prompt the service's engine sampled it from.
    assert result.metrics["context_exact_turns"] == result.metrics["sampled_turns"] == 4
    # The group the caller dropped crossed the wire: its tokens, read from the service's gateway, are the stale row.
    assert result.metrics["tokens_discarded_stale"] > 0 and result.metrics["tokens_unaccounted"] == 0


async def test_a_step_whose_answer_was_lost_is_applied_once_and_a_stale_one_is_refused(service, token, agent):
    from agentrl.backend.remote.wire import ModelRef, TrainRequest
    from tests.remote_client import sampled_group

    model = agent
    step = await model.get_step()
    lines = len((service.runs / "remote" / "agent" / "metrics.jsonl").read_text().splitlines())
    request = TrainRequest(
        model=ModelRef(project="remote", name="agent"),
        groups=[await sampled_group(model) for _ in range(2)],
        config=agentrl.TrainConfig(learning_rate=1e-3),
        request_id="lost-answer-0001",
        from_step=step,
    ).model_dump_json()
    headers = {"Authorization": f"Bearer {token}", "content-type": "application/json"}
    async with httpx.AsyncClient(base_url=service.url, headers=headers) as client:
        with pytest.raises(httpx.ReadTimeout):  # a proxy's read timeout: the client never hears the answer
            await client.post("/backend/train", content=request, timeout=0.3)
        retry = await client.post("/backend/train", content=request, timeout=300)
        assert retry.status_code == 200 and retry.json()["step"] == step + 1, retry.text
        again = await client.post("/backend/train", content=request, timeout=300)
        assert again.json() == retry.json()
        stale = await client.post("/backend/train", content=request.replace("lost-answer-0001", "other-client-02"))
        assert (
            stale.status_code == 409
            and f"is at step {step + 1}, but this request was made at step {step}" in (stale.json()["message"])
        )
    assert await model.get_step() == step + 1
    assert len((service.runs / "remote" / "agent" / "metrics.jsonl").read_text().splitlines()) == lines + 1


async def test_token_ids_outside_the_vocabulary_are_refused_before_training(service, token, agent):
    from tests.helpers import make_choice
    from tests.remote_client import sampled_group

    model = agent
    step = await model.get_step()
    group = await sampled_group(model)
    forged = agentrl.Trajectory(
        messages_and_choices=[{"role": "user", "content": "Name a colour."}, make_choice([5, 10**12, -7])], reward=1.0
    )
    with pytest.raises(
        agentrl.TokenizationError, match="group 0, trajectory 2, assistant turn 0: token id 1000000000000"
    ):
        await model.train([agentrl.TrajectoryGroup([*group.trajectories, forged])], agentrl.TrainConfig())
    assert await model.get_step() == step
    result = await model.train([group], agentrl.TrainConfig(learning_rate=1e-3))  # the trainer is unharmed
    assert result.step == step + 1


async def test_after_the_server_dies_a_remote_client_registers_again_and_trains_on(service, token, agent):
    from tests.remote_client import sampled_group

    model, backend = agent, agent.backend
    step = await model.get_step()
    groups = [await sampled_group(model) for _ in range(2)]
    for process in vllm_processes(service):
        process.kill()
    with pytest.raises(agentrl.ServerError, match="[Rr]egister the model again"):
        await model.train(groups, agentrl.TrainConfig(learning_rate=1e-3))
    await asyncio.wait_for(model.register(backend), timeout=600)  # rebuilds the server and trainer
    assert await model.get_step() == step  # resumed from disk
    assert vllm_processes(service)
    result = await model.train([await sampled_group(model) for _ in range(2)], agentrl.TrainConfig(learning_rate=1e-3))
    assert result.step == step + 1
