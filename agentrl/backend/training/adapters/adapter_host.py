"""The trainer's model: a frozen base with one LoRA adapter (and AdamW optimizer) per trained model, made
active for the call that trains, saves or loads it, on this rank's device (and its shard of the layers).
Checkpoints: `adapter_state` (the live adapter) over `adapter_files`. The steps are `trainer.Trainer`'s."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from agentrl.backend.precision import bf16_is_native
from agentrl.backend.training.adapters.adapter_state import load_adapter, parameters_by_key, save_adapter, whole_weights
from agentrl.backend.training.step import sharding
from agentrl.backend.training.step.attention import use_cpu_attention
from agentrl.backend.training.step.gradients import Adapter
from agentrl.backend.training.step.kl_reference import KLReference
from agentrl.backend.training.step.lora_forward import fuse_lora_layers
from agentrl.foundation.config import LoRAConfig
from agentrl.foundation.errors import ConfigurationError
from agentrl.rl.micro_batches import default_micro_batch_tokens


class AdapterHost:
    """A frozen base model with one LoRA adapter (and optimizer) per trained model, and their checkpoints.

    Several models of one base share its weights in memory: each is a named peft adapter, made
    active for the call that trains, saves or loads it. Made inside an initialised
    `torch.distributed` process group, it is one rank of several: it trains on its share of each
    step's sequences and sums gradients with the other ranks (`agentrl.backend.training.ranks.ranks` runs them).
    `Trainer` adds the steps that update the adapters.
    """

    def __init__(self, model_path: str, *, seed: int = 0, device: str | None = None, sharded: bool = False) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model_path = model_path
        self.seed = seed
        distributed = dist.is_available() and dist.is_initialized()
        self.rank, self.world_size = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
        if sharded and self.world_size == 1:
            raise ConfigurationError("a sharded trainer needs 2 or more ranks (LocalBackend(trainer_ranks=...))")
        self.sharded = sharded
        """FSDP2: the decoder layers sharded over the ranks (see `agentrl.backend.training.step.sharding`), once the
        first adapter exists; the base stays on the CPU until then."""
        self.tokenizer: Any = AutoTokenizer.from_pretrained(model_path)  # a ChatTokenizer, and pad/eos ids
        self.bf16 = bf16_is_native(self.device.type)
        """bf16 base and autocast where the device has bf16; float32 on other CPUs (see `precision`)."""
        dtype = torch.bfloat16 if self.bf16 else torch.float32
        base: Any = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
        if self.device.type == "cpu":
            use_cpu_attention(base)
        self._base: Any = base if sharded else base.to(self.device)
        self.model: Any = None  # the peft model, made with the first adapter
        self.adapters: dict[str, Adapter] = {}
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else self.tokenizer.eos_token_id
        self.micro_batch_tokens = default_micro_batch_tokens(self.device)
        """Tokens per micro-batch unless the config sets them: halved for good at each GPU out-of-memory."""
        self.kl_reference = KLReference(sharded=sharded)

    def add_adapter(self, name: str, lora: LoRAConfig) -> None:
        """A fresh adapter (the same for the same seed) with its own optimizer; `name` must suit a
        torch module key (no '.')."""
        from peft import LoraConfig, get_peft_model

        if name in self.adapters:
            raise ValueError(f"the trainer already has an adapter named {name!r}")
        if self.sharded and self.adapters:
            raise ConfigurationError(
                "sharded trainer ranks train one model per backend (its LoRA is sharded with the layers); "
                "register this model on another LocalBackend, or use unsharded ranks"
            )
        torch.manual_seed(self.seed)  # the step-0 adapter (LoRA A) is the same for the same seed
        peft_config = LoraConfig(
            r=lora.rank,
            lora_alpha=lora.alpha,
            lora_dropout=lora.dropout,
            target_modules=list(lora.target_modules),
            task_type="CAUSAL_LM",
            base_model_name_or_path=self.model_path,  # recorded in each checkpoint: what it was trained on
        )
        # peft keeps the adapter in fp32 over a bf16 base (autocast_adapter_dtype defaults to True).
        if self.model is None:
            self.model = get_peft_model(self._base, peft_config, adapter_name=name)
            if self.sharded:
                sharding.shard_decoder_layers(self._base, self.device, self.world_size)
        else:
            self.model.add_adapter(name, peft_config)
        fuse_lora_layers(self.model)
        parameters = list(parameters_by_key(self.model, name).values())
        self.adapters[name] = Adapter(parameters, torch.optim.AdamW(parameters, lr=1e-5))

    def _activate(self, name: str) -> Adapter:
        """Make `name` the adapter that forward passes use and gradients reach."""
        adapter = self.adapters.get(name)
        if adapter is None:
            raise KeyError(f"the trainer has no adapter {name!r} (it has {sorted(self.adapters)})")
        if self.model.active_adapter != name:
            self.model.set_adapter(name)  # also makes only this adapter's tensors require grad
        return adapter

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        """bf16 autocast where the device has bf16 (CPU, CUDA); none in float32, or on `meta`, where tests
        check device placement."""
        if self.device.type in ("cpu", "cuda") and self.bf16:
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    # --- checkpoints ---

    def save(self, name: str, folder: Path) -> None:
        """Write adapter `name` (peft's format, which vLLM loads) and its optimizer state into `folder`.
        Sharded, every rank must call it (the whole tensors are gathered) and rank 0 writes."""
        save_adapter(self.model, name, self._activate(name), folder, sharded=self.sharded, writes=self.rank == 0)

    def adapter_weights(self, name: str, rank: int | None = None) -> dict[str, torch.Tensor]:
        """A copy of adapter `name`'s whole weights, keyed as in its checkpoint (peft's names), as this
        trainer holds them (`rank`: None or this trainer's own). Sharded, every rank must call it."""
        if rank not in (None, self.rank):
            raise ValueError(f"this trainer is rank {self.rank} of {self.world_size}; it holds no rank {rank}")
        return whole_weights(self.model, name)

    def parameter_bytes(self) -> list[int]:
        """Bytes of weights this rank holds (its shards only, when sharded): what sharding saves. A list of
        one, as `TrainerRanks` gives one per rank."""
        tensors = {id(p): p for p in (self.model or self._base).parameters()}.values()
        return [sum((p.to_local() if sharding.is_sharded(p) else p).nbytes for p in tensors)]

    def close(self) -> None:
        """Nothing to stop: the trainer lives in this process (`TrainerRanks.close` stops its processes)."""

    def load(self, name: str, folder: Path) -> None:
        """Restore the adapter and optimizer state saved by `save`, after checking both: `CheckpointError`
        (and nothing changed) for a missing, unreadable, misshapen or non-finite file."""
        load_adapter(self.model, name, self._activate(name), folder, sharded=self.sharded)
