"""The model a step's KL terms measure against: the base (the adapter off), or another LoRA adapter of the same
base loaded beside the trained one (`TrainConfig.kl_reference`, ART's `kl_penalty_reference_step`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from agentrl.backend.training.step.lora_forward import fuse_lora_layers
from agentrl.foundation.errors import ConfigurationError

REFERENCE_ADAPTER = "agentrl_kl_reference"
"""The reference's peft adapter name: never trained, saved or served."""


class KLReference:
    """The reference pass of a step, with the last reference adapter kept loaded (one at a time)."""

    def __init__(self, *, sharded: bool = False) -> None:
        self.sharded = sharded
        self._loaded: tuple[str, int] | None = None  # (folder, adapter file mtime) of the adapter loaded

    @contextlib.contextmanager
    def active(self, model: Any, trained: str, folder: int | str | None) -> Iterator[None]:
        """Within it, forward passes of `model` compute the reference without gradients: the base where `folder`
        is None, else the adapter in `folder`; `trained` is the adapter made active again after."""
        if isinstance(folder, int):
            raise ConfigurationError(
                f"kl_reference={folder} (a step) reached the trainer unresolved: a backend resolves steps to their "
                "checkpoint folders; give the trainer a folder"
            )
        if folder is None:
            with torch.no_grad(), model.disable_adapter():
                yield
            return
        if self.sharded:
            raise ConfigurationError("sharded trainer ranks measure KL to the base model only: set kl_reference=None")
        self._load(model, folder)
        model.set_adapter(REFERENCE_ADAPTER)
        try:
            with torch.no_grad():
                yield
        finally:
            model.set_adapter(trained)  # also gives `trained` its gradients back

    def _load(self, model: Any, folder: str) -> None:
        weights = Path(folder) / "adapter_model.safetensors"
        if not (Path(folder) / "adapter_config.json").is_file() or not weights.is_file():
            raise ConfigurationError(
                f"kl_reference {folder!r} holds no peft adapter (adapter_config.json and adapter_model.safetensors): "
                "give a checkpoint folder of this model, a step, or None for the base model"
            )
        key = (str(Path(folder).resolve()), weights.stat().st_mtime_ns)
        if self._loaded == key:
            return
        if self._loaded is not None:
            model.delete_adapter(REFERENCE_ADAPTER)
            self._loaded = None
        try:
            model.load_adapter(folder, adapter_name=REFERENCE_ADAPTER, is_trainable=False)
        except (ValueError, RuntimeError, KeyError) as error:
            raise ConfigurationError(
                f"kl_reference {folder!r} is not a LoRA adapter this base model can load ({error}); give a "
                "checkpoint of a model of the same base with the same target modules"
            ) from error
        fuse_lora_layers(model)
        self._loaded = key
