"""What the models of a `LocalBackend` share: the base model, its vLLM servers and the trainer, started
by the first register and stopped together."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agentrl.backend.serving.replicas import ServerReplicas
from agentrl.backend.training.rank_hosts import JoinPoint
from agentrl.backend.training.ranks import TrainerRanks
from agentrl.backend.training.step_input import use_deterministic_kernels
from agentrl.backend.training.trainer import Trainer
from agentrl.base_models import resolve_base_model
from agentrl.errors import ConfigurationError
from agentrl.run_folder import RunFolder

if TYPE_CHECKING:
    from agentrl.backend.session import TrainerThread
    from agentrl.backend.training.adapter_trainer import AdapterTrainer
    from agentrl.model import TrainableModel


@dataclass(frozen=True)
class TrainerPlacement:
    """Where the trainer runs: its device ("cuda:1", or None for the server's), how many `torch.distributed`
    ranks, whether they shard the decoder layers (FSDP2), the seed of a fresh adapter, whether its
    kernels are deterministic (what a bit-exact replay on a GPU needs), and where ranks on other hosts
    join (`join`: the last `join.remote_ranks` of the ranks)."""

    seed: int = 0
    device: str | None = None
    ranks: int = 1
    sharded: bool = False
    deterministic: bool = False
    join: JoinPoint | None = None

    def __post_init__(self) -> None:
        if self.ranks < 1:
            raise ConfigurationError(f"trainer_ranks must be 1 or more, got {self.ranks}")
        if self.sharded and self.ranks < 2:
            raise ConfigurationError(
                "shard_trainer shards the model over trainer ranks: set trainer_ranks to 2 or more"
            )
        if self.join is not None and self.join.remote_ranks >= self.ranks:
            raise ConfigurationError(
                f"{self.join.remote_ranks} trainer ranks on other hosts need trainer_ranks of at least "
                f"{self.join.remote_ranks + 1}: rank 0 runs on this host"
            )


@dataclass
class Engine:
    """The base model, its vLLM server replicas and the trainer (one adapter per registered model)."""

    base_model: str
    model_path: str
    server: ServerReplicas
    trainer: AdapterTrainer
    vocab_size: int
    """Token ids a client may send for training lie in [0, vocab_size)."""

    def check_fits(self, model: TrainableModel) -> None:
        """A `ConfigurationError` naming the fix when `model` cannot share this engine."""
        if model.base_model != self.base_model:
            raise ConfigurationError(
                f"this backend serves base model {self.base_model!r}; model {model.name!r} asks for "
                f"{model.base_model!r}. Models of one backend share one base model: use another LocalBackend"
            )
        if model.lora.rank > self.server.max_lora_rank:
            raise ConfigurationError(
                f"model {model.name!r} has LoRA rank {model.lora.rank}, above the server's max_lora_rank "
                f"{self.server.max_lora_rank} (set by the first model registered); register the model with "
                "the largest rank first"
            )

    async def stop(self) -> None:
        await asyncio.to_thread(self.server.stop)
        await asyncio.to_thread(self.trainer.close)


async def start_engine(model: TrainableModel, placement: TrainerPlacement, thread: TrainerThread) -> Engine:
    """Start the servers and the trainer for `model`'s base model (the trainer's calls on `thread`); a
    failure stops whatever had started."""
    model_path = await thread.run(resolve_base_model, model.base_model)
    vocab_size = await thread.run(_vocab_size, model_path)
    server = ServerReplicas(model_path, RunFolder(model.run_dir).logs, model.server, max_lora_rank=model.lora.rank)
    # On a CPU the server spends its start importing, one core at a time: the trainer loads meanwhile
    # (~6 s of a 2-core float32 machine's ~40 s start). On a GPU vLLM sizes its memory from what is
    # free as it starts, so there the trainer loads first.
    starting = None if server.gpu else asyncio.ensure_future(server.start())
    try:
        trainer = await thread.run(_start_trainer, model_path, placement)
    except BaseException:
        if starting is not None:
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
            await asyncio.to_thread(server.stop)
        raise
    try:
        await (starting if starting is not None else server.start())
    except BaseException:
        await asyncio.to_thread(server.stop)
        await asyncio.to_thread(trainer.close)
        raise
    return Engine(model.base_model, model_path, server, trainer, vocab_size)


def _start_trainer(model_path: str, placement: TrainerPlacement) -> AdapterTrainer:
    if placement.ranks > 1:
        ranks = placement.ranks
        return TrainerRanks(
            model_path,
            ranks=ranks,
            seed=placement.seed,
            device=placement.device,
            sharded=placement.sharded,
            deterministic=placement.deterministic,
            join=placement.join,
        )
    if placement.deterministic:  # process-wide, before the trainer's first matmul (cuBLAS reads its setting then)
        use_deterministic_kernels()
    return Trainer(model_path, seed=placement.seed, device=placement.device)


def _vocab_size(model_path: str) -> int:
    """Rows of the model's token embedding: the ids its server can sample."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path)
    return int(config.get_text_config().vocab_size)
