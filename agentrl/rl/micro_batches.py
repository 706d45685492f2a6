"""A step's micro-batches, in one place: which sequences each micro-batch of a rank computes (sized by a token
budget, so memory is bounded whatever the number and length of trajectories; among ranks, each its share of the
rows by token count), packed as token trees where that pays (`agentrl.rl.packing`), and collated into tensors.

Pure: torch tensors, no I/O and no collective (a sharded trainer pads its plan with idle passes itself,
`MicroBatches.padded_to`). Shapes: `_T` tokens of one sequence, `_B` sequences of a micro-batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import torch

from agentrl.rl.packing import PackedBatch, pack, pack_rows
from agentrl.rl.tokenize import TokenizedSequence

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

    def padded_to(self, count: int) -> MicroBatches:
        """The plan with idle passes (None) up to `count` micro-batches: sharded ranks gather each layer
        together in every pass, so each runs as many as the rank with the most."""
        return replace(self, batches=[*self.batches, *[None] * (count - len(self.batches))])


def plan_step(
    sequences: list[TokenizedSequence], max_tokens: int, *, rank: int = 0, world_size: int = 1, pack_groups: bool | None
) -> MicroBatches:
    """Rank `rank`'s micro-batches, each a list of rows of indices into `sequences`. A row is one
    sequence, or a group's sequences packed as a token tree (`pack_groups`: True, False, or None for
    where that saves at least `PACKING_MIN_SAVING` of the tokens).
    Alone a rank takes every row; among `world_size` ranks, its share by token count."""
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
    share = split_by_tokens(sizes, world_size)[rank] if world_size > 1 else range(len(sizes))
    planned = plan_micro_batches([sizes[i] for i in share], max_tokens)
    batches: list[list[list[int]] | None] = [[rows[share[i]] for i in batch] for batch in planned]
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


@dataclass(frozen=True)
class TokenBatch:
    """Padded tensors for one forward/backward pass. Padding is on the right and carries no loss."""

    input_ids_BT: torch.Tensor  # long
    attention_mask_BT: torch.Tensor  # long, 1 on real tokens
    loss_mask_BT: torch.Tensor  # float, 1 on sampled assistant tokens
    sampler_logprobs_BT: torch.Tensor  # float32
    advantages_BT: torch.Tensor  # float32, each sequence's advantage on every position
    group_ids_B: torch.Tensor  # long

    @property
    def num_loss_tokens(self) -> int:
        return int(self.loss_mask_BT.sum())

    def to(self, device: torch.device) -> TokenBatch:
        return TokenBatch(*(getattr(self, f.name).to(device) for f in fields(self)))


def collate(sequences: Sequence[TokenizedSequence], pad_token_id: int) -> TokenBatch:
    """Right-pad sequences into one batch."""
    if not sequences:
        raise ValueError("collate needs at least one sequence")
    width = max(len(s) for s in sequences)
    shape = (len(sequences), width)
    input_ids_BT = torch.full(shape, pad_token_id, dtype=torch.long)
    attention_mask_BT = torch.zeros(shape, dtype=torch.long)
    loss_mask_BT = torch.zeros(shape, dtype=torch.float32)
    sampler_logprobs_BT = torch.zeros(shape, dtype=torch.float32)
    for row, seq in enumerate(sequences):
        n = len(seq)
        input_ids_BT[row, :n] = torch.tensor(seq.input_ids_T, dtype=torch.long)
        attention_mask_BT[row, :n] = 1
        loss_mask_BT[row, :n] = torch.tensor(seq.loss_mask_T, dtype=torch.float32)
        sampler_logprobs_BT[row, :n] = torch.tensor(seq.sampler_logprobs_T, dtype=torch.float32)
    advantages_BT = torch.tensor([s.advantage for s in sequences], dtype=torch.float32)[:, None].expand(shape).clone()
    group_ids_B = torch.tensor([s.group_index for s in sequences], dtype=torch.long)
    return TokenBatch(input_ids_BT, attention_mask_BT, loss_mask_BT, sampler_logprobs_BT, advantages_BT, group_ids_B)


def plan_micro_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Split sequence indices into micro-batches whose padded size (rows x longest) fits `max_tokens`.

    Sorting by length keeps padding small. A sequence longer than the budget gets a batch of its own.
    """
    batches: list[list[int]] = []
    current: list[int] = []
    for index in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        # Sorted ascending, so the newcomer is the longest of the batch it joins.
        if current and (len(current) + 1) * lengths[index] > max_tokens:
            batches.append(current)
            current = []
        current.append(index)
    if current:
        batches.append(current)
    return batches


def split_by_tokens(lengths: Sequence[int], parts: int) -> list[list[int]]:
    """Sequence indices dealt to `parts` trainer ranks so each gets about the same number of tokens.

    Longest first, each to the rank with the fewest tokens so far (ties to the lowest rank): the
    same lengths always give the same split, on every rank. Each part lists its indices in order.
    """
    loads = [0] * parts
    shares: list[list[int]] = [[] for _ in range(parts)]
    for index in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        rank = min(range(parts), key=lambda r: (loads[r], r))
        shares[rank].append(index)
        loads[rank] += lengths[index]
    return [sorted(share) for share in shares]
