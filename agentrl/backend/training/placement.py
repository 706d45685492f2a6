"""Where a trainer runs (`TrainerPlacement`: device, ranks, sharding, kernels, other hosts) and starting
one there: what a `LocalBackend` and a replay of a recorded step both need."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from agentrl.backend.training.ranks.rank_hosts import JoinPoint
from agentrl.backend.training.ranks.ranks import TrainerRanks
from agentrl.backend.training.step_input import use_deterministic_kernels
from agentrl.backend.training.trainer import Trainer
from agentrl.foundation.errors import ConfigurationError

if TYPE_CHECKING:
    from agentrl.backend.training.adapter_trainer import AdapterTrainer


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


def start_trainer(model_path: str, placement: TrainerPlacement) -> AdapterTrainer:
    """A trainer on `model_path` placed as `placement` says: one `Trainer` in this process, or `TrainerRanks`."""
    if placement.ranks > 1:
        return TrainerRanks(
            model_path,
            ranks=placement.ranks,
            seed=placement.seed,
            device=placement.device,
            sharded=placement.sharded,
            deterministic=placement.deterministic,
            join=placement.join,
        )
    if placement.deterministic:  # process-wide, before the trainer's first matmul (cuBLAS reads its setting then)
        use_deterministic_kernels()
    return Trainer(model_path, seed=placement.seed, device=placement.device)
