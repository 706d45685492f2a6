"""The training backend (torch, transformers, peft, vLLM) is an extra; a clear error where it is missing."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from agentrl.foundation.distribution import install_extra

BACKEND_PACKAGES = frozenset({"torch", "transformers", "peft", "gguf", "vllm"})
"""What the `cpu` / `gpu` extras add to a client install (types, gather, judges, RemoteBackend)."""


class BackendNotInstalledError(ImportError):
    """A piece that trains or serves on this machine was used in an install without the training backend."""


@contextmanager
def missing_backend_extra(what: str) -> Iterator[None]:
    """Turn the import error of a backend package into one that says which extra to install."""
    try:
        yield
    except ModuleNotFoundError as error:
        package = (error.name or "").split(".")[0]
        if package not in BACKEND_PACKAGES:
            raise
        raise BackendNotInstalledError(
            f"{what} trains and serves models on this machine, which needs the training backend, and {package!r} "
            f"is not installed: {install_extra('cpu')} on a CPU machine or {install_extra('gpu')} on an NVIDIA GPU "
            "(a client of a RemoteBackend needs neither)"
        ) from error
