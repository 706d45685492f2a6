"""How much each training sequence weighs when sequences take optimizer steps of their own (ART's LocalBackend):
by conversation, each conversation alike however many sequences its turns took. Pure Python, no I/O."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentrl.foundation.config import TrainConfig
    from agentrl.rl.tokenize import TokenizedSequence


def conversation_keys(sequences: Sequence[TokenizedSequence]) -> list[object]:
    """Which conversation each sequence trains: its `history_index`, or (without one) the sequence itself."""
    return [s.history_index if s.history_index is not None else ("own", i) for i, s in enumerate(sequences)]


def conversation_weights(sequences: Sequence[TokenizedSequence]) -> list[float]:
    """Each sequence's share of its conversation (1 / the sequences that conversation took), so that per-conversation
    averages weigh every conversation alike however many sequences its turns needed."""
    keys = conversation_keys(sequences)
    counts: dict[object, int] = {}
    for key in keys:
        counts[key] = counts.get(key, 0) + 1
    return [1 / counts[key] for key in keys]


def per_sequence_denominators(sequences: Sequence[TokenizedSequence], config: TrainConfig) -> list[float]:
    """What each sequence's summed loss is divided by when it takes an optimizer step of its own: its loss tokens
    (its mean, as ART's Unsloth trainer reduces a row) times its conversation's loss tokens over the mean
    conversation's (ART's weight of 1/the trajectory's length, normalised to a token mean of 1). With
    `loss_normalization="constant"`, the constant."""
    tokens_S = [sum(s.loss_mask_T[1:]) for s in sequences]
    if config.loss_normalization == "constant":
        return [float(config.normalization_constant)] * len(sequences)
    shares_S = conversation_weights(sequences)
    conversation_tokens: dict[object, int] = {}
    keys = conversation_keys(sequences)
    for key, tokens in zip(keys, tokens_S, strict=True):
        conversation_tokens[key] = conversation_tokens.get(key, 0) + tokens
    mean_conversation_tokens = sum(tokens_S) / sum(shares_S)
    return [
        max(tokens, 1) * conversation_tokens[key] / mean_conversation_tokens
        for tokens, key in zip(tokens_S, keys, strict=True)
    ]
