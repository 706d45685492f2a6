"""The trainer's attention on a CPU: plain matmul-softmax-matmul for short sequences, SDPA for long.

Causal by default; packed token trees (`agentrl.rl.packing`) bring their own boolean mask.

torch's CPU flash-attention kernel has a high fixed cost per (batch, head) block: on this 2-core
machine a causal forward+backward over 4,096 tokens took 61 ms as 64 sequences of 64 tokens but
24 ms done as explicit matmuls, while at 256 tokens and beyond the kernel wins (46 vs 87 ms, and
far more at 1-2k tokens, where the explicit form also holds a T x T matrix per head). Measured
crossover: between 128 and 192 tokens. GPUs keep SDPA (`sdpa` is their default).
"""

from __future__ import annotations

from typing import Any

import torch

NAME = "agentrl_cpu"
SHORT_SEQUENCE = 128
"""Longest batch (tokens) computed with explicit matmuls."""


def _attention(
    module: torch.nn.Module,
    query_BHTD: torch.Tensor,
    key_BKTD: torch.Tensor,
    value_BKTD: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature; returns the output as (B, T, heads, head_dim)."""
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

    length = query_BHTD.shape[2]
    square = key_BKTD.shape[2] == length
    causal_training = attention_mask is None and square and getattr(module, "is_causal", True)
    tree = attention_mask is not None and attention_mask.dtype == torch.bool and square  # packed rows' own mask
    if length > SHORT_SEQUENCE or not (causal_training or tree) or (dropout and module.training):
        return sdpa_attention_forward(
            module, query_BHTD, key_BKTD, value_BKTD, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    groups = query_BHTD.shape[1] // key_BKTD.shape[1]
    key_BHTD, value_BHTD = repeat_kv(key_BKTD, groups), repeat_kv(value_BKTD, groups)
    scale = scaling if scaling is not None else query_BHTD.shape[-1] ** -0.5
    scores_BHTT = (query_BHTD @ key_BHTD.transpose(-1, -2)) * scale
    if attention_mask is not None:  # True where a query may attend: blocked is the rest
        blocked = ~attention_mask
    else:
        blocked = torch.ones(length, length, dtype=torch.bool, device=query_BHTD.device).triu(1)
    weights_BHTT = torch.softmax(scores_BHTT.masked_fill(blocked, float("-inf")), dim=-1, dtype=torch.float32)
    output_BHTD = weights_BHTT.to(value_BHTD.dtype) @ value_BHTD
    return output_BHTD.transpose(1, 2).contiguous(), None


def use_cpu_attention(causal_lm: Any) -> None:
    """Register the attention above with transformers and make `causal_lm` use it."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(NAME, _attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)  # masks as SDPA takes them (None when causal suffices)
    causal_lm.set_attn_implementation(NAME)
