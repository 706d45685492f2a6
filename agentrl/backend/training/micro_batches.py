"""A step's plan: which sequences each micro-batch of this rank computes, packed as token trees or not.

Micro-batches are sized by a token budget, so memory is bounded whatever the number and length of
trajectories; among ranks, each takes its share of the rows by token count.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from agentrl.rl.packing import PackedBatch, pack, pack_rows
from agentrl.rl.tokenize import TokenBatch, TokenizedSequence, collate, plan_micro_batches, split_by_tokens

PACKING_MIN_SAVING = 0.1
"""`TrainConfig.shared_prefix=None` packs a step when that computes at least this share fewer tokens."""


def default_micro_batch_tokens(device: torch.device) -> int:
    """Tokens per micro-batch when the config leaves it open: 2,048 on a CPU, where activations that
    stay in cache made steps fastest (measured on 2 cores: 2,048 beat 1,024, 3,072 and 4,096), and
    16,384 on a GPU, which needs large matmuls to be busy."""
    return 2048 if device.type == "cpu" else 16384


@dataclass(frozen=True)
class MicroBatches:
    """A step's plan: this rank's micro-batches (rows of sequence indices; None: an idle pass), whether
    rows are packed token trees, the tokens all ranks' forward passes compute, and the token budget
    each micro-batch kept to."""

    batches: list[list[list[int]] | None]
    packed: bool
    forward_tokens: int
    max_tokens: int


@dataclass(frozen=True)
class RankPlace:
    """Where a trainer stands among ranks: which share it takes, and whether its layers are sharded."""

    device: torch.device
    rank: int = 0
    world_size: int = 1
    sharded: bool = False


def plan_step(
    sequences: list[TokenizedSequence], max_tokens: int, place: RankPlace, *, pack_groups: bool | None
) -> MicroBatches:
    """This rank's micro-batches, each a list of rows of indices into `sequences`. A row is one
    sequence, or a group's sequences packed as a token tree (`pack_groups`: True, False, or None for
    where that saves at least `PACKING_MIN_SAVING` of the tokens).
    Alone a rank takes every row; among ranks, its share by token count. Sharded, padded with `None`
    (an idle pass) up to the most any rank has, since sharded ranks gather each layer together in
    every pass."""
    rows, sizes = [[i] for i in range(len(sequences))], [len(s) for s in sequences]
    packed = False
    if pack_groups is not False:
        tree_rows, tree_sizes = pack_rows(
            [s.input_ids_T for s in sequences],
            [s.group_index for s in sequences],
            max_tokens,
            units=[s.history_index for s in sequences],
        )
        if pack_groups or sum(tree_sizes) <= (1 - PACKING_MIN_SAVING) * sum(sizes):
            rows, sizes, packed = tree_rows, tree_sizes, True
    share = split_by_tokens(sizes, place.world_size)[place.rank] if place.world_size > 1 else range(len(sizes))
    planned = plan_micro_batches([sizes[i] for i in share], max_tokens)
    batches: list[list[list[int]] | None] = [[rows[share[i]] for i in batch] for batch in planned]
    if place.sharded:
        most = torch.tensor(len(batches), device=place.device)
        dist.all_reduce(most, op=dist.ReduceOp.MAX)
        batches += [None] * (int(most) - len(batches))
    return MicroBatches(batches, packed, sum(sizes), max_tokens)


def collate_rows(
    sequences: list[TokenizedSequence], rows: list[list[int]], packed: bool, pad_token_id: int, device: torch.device
) -> tuple[TokenBatch, PackedBatch | None]:
    """One micro-batch on the device: its sequences padded (targets, masks, advantages), and where the
    plan packed them, the token trees the forward pass computes instead."""
    batch = collate([sequences[i] for row in rows for i in row], pad_token_id).to(device)
    if not packed:
        return batch, None
    return batch, pack([[sequences[i].input_ids_T for i in row] for row in rows], pad_token_id).to(device)
