"""What the models of a `LocalBackend` share: the base model, its vLLM servers and the trainer, started
by the first register and stopped together."""

from __future__ import annotations

import asyncio
import gc
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agentrl.backend.serving.replicas import ServerReplicas
from agentrl.backend.training.placement import TrainerPlacement, start_trainer
from agentrl.foundation.base_models import resolve_base_model
from agentrl.foundation.errors import ConfigurationError
from agentrl.records.run_folder import RunFolder

if TYPE_CHECKING:
    from agentrl.backend.session import TrainerThread
    from agentrl.backend.training.adapter_trainer import AdapterTrainer
    from agentrl.client.model import TrainableModel


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
        gc.unfreeze()  # the stopped trainer's objects become collectable again (`freeze_heap`)


async def start_engine(model: TrainableModel, placement: TrainerPlacement, thread: TrainerThread) -> Engine:
    """Start the servers and the trainer for `model`'s base model (the trainer's calls on `thread`); a
    failure stops whatever had started."""
    model_path = await thread.run(resolve_base_model, model.base_model)
    server = ServerReplicas(model_path, RunFolder(model.run_dir).logs, model.server, max_lora_rank=model.lora.rank)
    # On a CPU the server spends its start importing, one core at a time: the trainer imports and loads
    # meanwhile (~6 s of a 2-core float32 machine's ~40 s start; on a bf16 EPYC the server starting first
    # saved the 1.7 s the trainer's imports took: 13.3 s -> 11.1-11.6 s to register). On a GPU vLLM sizes its
    # memory from what is free as it starts, so there the trainer loads first.
    starting = None if server.gpu else asyncio.ensure_future(server.start())
    try:
        vocab_size = await thread.run(_vocab_size, model_path)
        trainer = await thread.run(start_trainer, model_path, placement)
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
    freeze_heap()
    return Engine(model.base_model, model_path, server, trainer, vocab_size)


def freeze_heap() -> None:
    """Take the objects alive now (~750k: torch's, transformers' and peft's imports, the loaded model) out of
    Python's full collections, which otherwise walk all of them each time: in the main job's process a full
    collection after the start took ~0.4 s, and 0.02-0.05 s once frozen (bf16 EPYC). `Engine.stop` puts
    them back."""
    gc.collect()
    gc.freeze()


def _vocab_size(model_path: str) -> int:
    """Rows of the model's token embedding: the ids its server can sample."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path)
    return int(config.get_text_config().vocab_size)
