"""Sequences that share a prefix, packed as a token tree so the trainer computes the prefix once.

Every rollout of a GRPO group repeats the group's prompt: 8 rollouts of a P-token prompt with
C-token answers cost 8(P+C) tokens of forward and backward where P+8C would do. Packing puts a
row's sequences into a trie: a token that several sequences reach through the same tokens is one
node. Each node attends to its ancestors and itself only (a tree-shaped causal mask) and sits at
its depth (its position in every sequence through it). A causal model's hidden state at a position
depends only on the tokens up to it, so each sequence's hidden states are its nodes' hidden states:
the same numbers as computing it alone (up to the rounding of other matmul shapes), and gradients
from every sequence through a shared node add up in it, as they would over the copies.

Shapes: `_R` packed rows, `_N` nodes of a row (padded to the widest row), `_B`/`_T` the micro-batch's
sequences and their tokens, as `collate` lays them out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch


@dataclass
class TokenTrie:
    """One packed row: the distinct (prefix, token) nodes of the sequences added so far."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)  # -1 for a root
    depths: list[int] = field(default_factory=list)
    paths: list[list[int]] = field(default_factory=list)  # each added sequence's node per token
    _children: dict[tuple[int, int], int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.tokens)

    def new_nodes(self, *sequences: Sequence[int]) -> int:
        """How many nodes adding these sequences would create (each one's tokens after its longest prefix shared
        with the trie or with the sequences before it)."""
        pending: dict[tuple[int, int], int] = {}  # nodes the sequences before would create, numbered below the root
        for token_ids in sequences:
            parent = -1
            for token in token_ids:
                node = self._children.get((parent, token), pending.get((parent, token)))
                if node is None:
                    node = -2 - len(pending)
                    pending[(parent, token)] = node
                parent = node
        return len(pending)

    def add(self, token_ids: Sequence[int]) -> None:
        parent, path = -1, []
        for depth, token in enumerate(token_ids):
            node = self._children.get((parent, token))
            if node is None:
                node = len(self.tokens)
                self._children[(parent, token)] = node
                self.tokens.append(token)
                self.parents.append(parent)
                self.depths.append(depth)
            path.append(node)
            parent = node
        self.paths.append(path)


def pack_rows(
    sequences: Sequence[Sequence[int]],
    keys: Sequence[int],
    max_nodes: int,
    units: Sequence[int | None] | None = None,
) -> tuple[list[list[int]], list[int]]:
    """Sequence indices grouped into rows to pack, and each row's nodes. Sequences with the same key
    (a GRPO group, whose rollouts share a prompt) share a row, split where a row would pass
    `max_nodes` nodes. Consecutive sequences with the same `units` entry (the turns of one conversation, which
    share its earlier context; None: a unit of its own) always share a row; a unit larger than `max_nodes` gets a row of its own.
    Rows keep the sequences' order."""
    rows: list[tuple[list[int], TokenTrie]] = []
    open_rows: dict[int, tuple[list[int], TokenTrie]] = {}
    for unit in _consecutive_runs(units if units is not None else [None] * len(sequences)):
        token_ids = [sequences[i] for i in unit]
        key = keys[unit[0]]
        row, trie = open_rows.get(key, ([], TokenTrie()))
        if row and len(trie) + trie.new_nodes(*token_ids) > max_nodes:
            row, trie = [], TokenTrie()
        if not row:
            rows.append((row, trie))
            open_rows[key] = (row, trie)
        for index, ids in zip(unit, token_ids, strict=True):
            row.append(index)
            trie.add(ids)
    return [row for row, _ in rows], [len(trie) for _, trie in rows]


def _consecutive_runs(labels: Sequence[int | None]) -> list[list[int]]:
    """Indices grouped into runs of equal consecutive labels, None alone: [7, 7, 3, None, None] -> [[0, 1], [2],
    [3], [4]]."""
    runs: list[list[int]] = []
    for index, label in enumerate(labels):
        if runs and label is not None and labels[runs[-1][-1]] == label:
            runs[-1].append(index)
        else:
            runs.append([index])
    return runs


@dataclass(frozen=True)
class PackedBatch:
    """A micro-batch's sequences as token trees, one row per trie, and where each sequence's tokens sit."""

    input_ids_RN: torch.Tensor  # long, pad token after a row's nodes
    position_ids_RN: torch.Tensor  # long, each node's depth (0 on padding)
    attention_R1NN: torch.Tensor  # bool: [r, 0, n, m] node n attends to node m (an ancestor or itself)
    node_of_BT: torch.Tensor  # long: flat index (row * N + node) of sequence b's token t; 0 on padding
    num_nodes: int  # real (unpadded) nodes: the tokens the forward computes

    def to(self, device: torch.device) -> PackedBatch:
        return replace(
            self,
            input_ids_RN=self.input_ids_RN.to(device),
            position_ids_RN=self.position_ids_RN.to(device),
            attention_R1NN=self.attention_R1NN.to(device),
            node_of_BT=self.node_of_BT.to(device),
        )


def pack(rows: Sequence[Sequence[Sequence[int]]], pad_token_id: int) -> PackedBatch:
    """Pack each row's sequences into one trie row. The sequences' order in `node_of_BT` is the rows'
    order, flattened: the order `collate` gets them in."""
    tries = []
    for row in rows:
        trie = TokenTrie()
        for token_ids in row:
            trie.add(token_ids)
        tries.append(trie)
    width = max(len(t) for t in tries)
    longest = max(len(s) for row in rows for s in row)
    num_sequences = sum(len(row) for row in rows)
    input_ids_RN = torch.full((len(tries), width), pad_token_id, dtype=torch.long)
    position_ids_RN = torch.zeros((len(tries), width), dtype=torch.long)
    attention_RNN = torch.zeros((len(tries), width, width), dtype=torch.bool)
    node_of_BT = torch.zeros((num_sequences, longest), dtype=torch.long)
    b = 0
    for r, trie in enumerate(tries):
        n = len(trie)
        input_ids_RN[r, :n] = torch.tensor(trie.tokens, dtype=torch.long)
        position_ids_RN[r, :n] = torch.tensor(trie.depths, dtype=torch.long)
        allowed_NN = attention_RNN[r]
        for node, parent in enumerate(trie.parents):  # parents come before their children
            if parent >= 0:
                allowed_NN[node] = allowed_NN[parent]
            allowed_NN[node, node] = True
        allowed_NN.fill_diagonal_(True)  # padding nodes attend to themselves only: no empty softmax row
        for path in trie.paths:
            node_of_BT[b, : len(path)] = torch.tensor(path, dtype=torch.long) + r * width
            b += 1
    return PackedBatch(input_ids_RN, position_ids_RN, attention_RNN[:, None], node_of_BT, sum(len(t) for t in tries))
