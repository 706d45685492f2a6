"""A vLLM plugin: on a CPU, multiply each adapter's tokens by its LoRA weights in one matmul.

vLLM's CPU LoRA path (`PunicaWrapperCPU` and `vllm.lora.ops.torch_ops`) spreads each sequence's
adapter index over its tokens again in every layer, gathers a copy of the LoRA matrix for every
token (`weights[indices]`), casts the activations to float32 and contracts token by token
(`einsum("bi, boi -> bo")`), two calls per slice of a fused layer. In a rollout phase every token
uses the same adapter, so this version groups tokens by adapter index, does one matmul per group
(one in practice) and shrinks all slices at once. It also treats index -1 as "no adapter", as
vLLM's GPU kernels do. `benchmarks/sampling.py` measures the effect on the adapter's throughput.

Loaded by vLLM in each of its processes through the `vllm.general_plugins` entry point, and active
only where the environment sets `AGENTRL_VLLM_GROUPED_LORA=1` (agentrl's CPU servers do; set it to
0 to compare), so other vLLM servers on the machine are left alone.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

ENV = "AGENTRL_VLLM_GROUPED_LORA"
NO_ADAPTER = -1  # vLLM's index for a request to the base model
EXPAND_FLOAT32_ROWS = 256  # up to this many tokens (decode batches), float32 expands beat bf16 (~20 us a call)
logger = logging.getLogger(__name__)


def per_adapter(weights: torch.Tensor) -> torch.Tensor:
    """vLLM's stacked LoRA weights, (L, 1, O, I) or (L, O, I), as (L, O, I): one matrix per adapter slot."""
    return weights.squeeze(1) if weights.dim() == 4 else weights


def grouped_lora_products(
    inputs_NI: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor | int, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Row n of the result is inputs[n] @ weights[indices[n]]^T, one matmul per distinct index.

    `weights` is (L, O, I) or (L, 1, O, I); `indices` is one index for every row or one per row.
    Index -1 means no adapter (a base-model request): its rows are zero, as in vLLM's GPU kernels;
    vLLM's CPU ops index with it as Python does and so give those rows the last slot's LoRA. The
    product runs in `dtype`, by default the weights' (bf16 on agentrl's servers, as the trainer's
    LoRA does), and the caller casts the small result: vLLM's ops cast the activations to float32
    first, which cost more than the products themselves.
    """
    weights_LOI = per_adapter(weights)
    dtype = dtype or weights_LOI.dtype
    inputs_NI = inputs_NI.to(dtype)
    values = [indices] if isinstance(indices, int) else sorted(set(indices.tolist()))
    if values == [NO_ADAPTER]:
        return inputs_NI.new_zeros(inputs_NI.shape[0], weights_LOI.shape[1])
    if len(values) == 1:
        return inputs_NI @ weights_LOI[values[0]].to(dtype).t()
    assert isinstance(indices, torch.Tensor)
    outputs_NO = inputs_NI.new_zeros(inputs_NI.shape[0], weights_LOI.shape[1])
    for value in values:
        if value != NO_ADAPTER:
            rows = (indices == value).nonzero().squeeze(1)
            outputs_NO[rows] = inputs_NI[rows] @ weights_LOI[value].to(dtype).t()
    return outputs_NO


def collapsed(indices: torch.Tensor) -> torch.Tensor | int:
    """The one value of `indices` when every entry holds it (one adapter serves the batch), else `indices`."""
    values = set(indices.tolist())
    return values.pop() if len(values) == 1 else indices


def token_indices(lora_indices_S: torch.Tensor, seq_len_S: torch.Tensor) -> torch.Tensor | int:
    """The adapter index of each token from each sequence's, or the one index when all sequences share it
    (the common case: a rollout phase samples one adapter), which skips vLLM's per-layer repeat_interleave."""
    shared = collapsed(lora_indices_S)
    return shared if isinstance(shared, int) else torch.repeat_interleave(lora_indices_S, seq_len_S)


def bgmv_shrink(
    inputs: torch.Tensor,
    lora_a_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor | int,
    scaling: float = 1.0,
) -> None:
    outputs = grouped_lora_products(inputs, lora_a_weights, lora_indices_tensor)
    output_tensor[:, : outputs.shape[1]] = scaling * outputs


def bgmv_expand(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor | int,
    add_inputs: bool = True,
) -> None:
    outputs = grouped_lora_products(inputs, lora_b_weights, lora_indices_tensor)
    limit = 1 if outputs.shape[0] == 1 and output_tensor.shape[0] != 1 else output_tensor.shape[0]
    common = min(outputs.shape[1], output_tensor.shape[1])  # adapter and model may pad differently
    if add_inputs:
        output_tensor[:, :common] += outputs[:limit, :common]
    else:
        output_tensor[:, :common] = outputs[:limit, :common]


def bgmv_expand_slice(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor | int,
    slice_offset: int,
    slice_size: int,
    add_inputs: bool = True,
) -> None:
    outputs = grouped_lora_products(inputs, lora_b_weights, lora_indices_tensor)
    if add_inputs:
        output_tensor[:, slice_offset : slice_offset + slice_size] += outputs
    else:
        output_tensor[:, slice_offset : slice_offset + slice_size] = outputs


# The sequence-wise ("sgmv") ops, which vLLM's CPU wrapper calls for every batch: the same products,
# with each sequence's adapter index spread over its tokens only when the sequences differ.


def sgmv_shrink(
    inputs: torch.Tensor,
    lora_a_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    b_seq_start_loc: torch.Tensor,
    seq_len_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    batches: int,
    max_seq_length: int,
    token_nums: int,
    scaling: float,
) -> None:
    indices = token_indices(lora_indices_tensor, seq_len_tensor)
    bgmv_shrink(inputs, lora_a_weights, output_tensor, indices, scaling)


def sgmv_expand(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    b_seq_start_loc: torch.Tensor,
    seq_len_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    batches: int,
    max_seq_length: int,
    token_nums: int,
    add_inputs: bool = False,
) -> None:
    indices = token_indices(lora_indices_tensor, seq_len_tensor)
    bgmv_expand(inputs, lora_b_weights, output_tensor, indices, add_inputs)


def sgmv_expand_slice(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    b_seq_start_loc: torch.Tensor,
    seq_len_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    batches: int,
    max_seq_length: int,
    token_nums: int,
    slice_offset: int,
    slice_size: int,
    add_inputs: bool = False,
) -> None:
    indices = token_indices(lora_indices_tensor, seq_len_tensor)
    bgmv_expand_slice(inputs, lora_b_weights, output_tensor, indices, slice_offset, slice_size, add_inputs)


def adapter_indices(wrapper: Any) -> torch.Tensor | int | None:
    """Each token's adapter index in the wrapper's current batch: one number when they share one (the
    common case), None when no token uses an adapter."""
    if wrapper.is_prefill:
        _, lengths_S, lora_S, *_ = wrapper.prefill_metadata
        indices = None if wrapper.no_lora else token_indices(lora_S, lengths_S)
    else:
        indices = collapsed(wrapper.token_lora_indices)
    return None if isinstance(indices, int) and indices == NO_ADAPTER else indices


def prepacked_matmul(weight_KN: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """x -> x @ weight through a oneDNN matmul with the weight packed once (vLLM's CPU build, which packs
    its base layers the same way): ~8 us a call for a rank-8 shrink at decode size on a 2-core EPYC,
    against ~21 us for torch's matmul, which sets the product up anew each call. torch's matmul where
    vLLM has no oneDNN or oneDNN takes no such weight (float16)."""
    try:
        from vllm import _custom_ops as ops

        if ops._supports_onednn:
            handler = ops.create_onednn_mm(weight_KN, 32)
            return lambda inputs_NK: ops.onednn_mm(handler, inputs_NK, None)
    except (ImportError, RuntimeError) as error:
        logger.debug("agentrl: no oneDNN matmul for %s LoRA weights (%s)", weight_KN.dtype, error)
    return lambda inputs_NK: inputs_NK @ weight_KN


@dataclass
class FusedLoRA:
    """One adapter slot's LoRA for a whole fused layer, laid out for two matmuls: every slice's A side by
    side, and every slice's B on the diagonal of one matrix, so slice k's rank columns expand into slice
    k's outputs only (the zeros add exactly nothing). Built and packed once per adapter load, not per step."""

    version: tuple[int, ...]
    a_IR: torch.Tensor
    b_RO: torch.Tensor
    shrink: Callable[[torch.Tensor], torch.Tensor]  # x_NI -> x_NI @ a_IR
    expand: Callable[[torch.Tensor], torch.Tensor]  # shrunk_NR -> shrunk_NR @ b_RO


_FUSED: dict[tuple[int, int, torch.dtype], FusedLoRA] = {}


def fused_lora(
    lora_a_stacked: tuple[torch.Tensor, ...], lora_b_stacked: tuple[torch.Tensor, ...], slot: int, dtype: torch.dtype
) -> FusedLoRA:
    """The slot's `FusedLoRA` in `dtype`, rebuilt when vLLM has written another adapter into the stacked
    weights (it loads one by copying into them in place, which bumps their version counters)."""
    version = tuple(v for t in (*lora_a_stacked, *lora_b_stacked) for v in (t.data_ptr(), t._version))
    key = (id(lora_a_stacked), slot, dtype)
    cached = _FUSED.get(key)
    if cached is not None and cached.version == version:
        return cached
    a_RI = torch.cat([per_adapter(a)[slot] for a in lora_a_stacked])
    b_slices = [per_adapter(b)[slot] for b in lora_b_stacked]
    b_OR = a_RI.new_zeros(sum(b.shape[0] for b in b_slices), a_RI.shape[0])
    row, column = 0, 0
    for b in b_slices:  # slice k's outputs read slice k's rank columns only
        b_OR[row : row + b.shape[0], column : column + b.shape[1]] = b
        row, column = row + b.shape[0], column + b.shape[1]
    a_IR, b_RO = a_RI.t().contiguous().to(dtype), b_OR.t().contiguous().to(dtype)
    fused = FusedLoRA(version, a_IR, b_RO, prepacked_matmul(a_IR), prepacked_matmul(b_RO))
    _FUSED[key] = fused
    return fused


def add_lora_linear(
    wrapper: Any,
    y: torch.Tensor,
    x: torch.Tensor,
    lora_a_stacked: tuple[torch.Tensor, ...],
    lora_b_stacked: tuple[torch.Tensor, ...],
    scale: float,
    output_slices: tuple[int, ...],
    **kwargs: Any,
) -> None:
    """y[:, slice] += x @ A^T @ B^T * scale for every slice of a fused layer (q, k, v or gate, up).

    Replaces PunicaWrapperCPU's method, which walks ten Python frames and two small matmuls per
    slice. When one adapter serves the batch (a rollout phase) the whole layer is two matmuls on weights
    fused and packed once per adapter load (`fused_lora`) and one add into y, all in y's dtype: a float32
    product of a decode batch's width (786 KB for gate/up) cost ~0.6 ms a call to allocate on a CPU.
    Batches that mix adapters group their tokens by adapter.
    """
    indices = adapter_indices(wrapper)
    if indices is None:
        return
    x_NI, y_NO = x.view(-1, x.shape[-1]), y.view(-1, y.shape[-1])
    if isinstance(indices, int):
        fused = fused_lora(lora_a_stacked, lora_b_stacked, indices, y_NO.dtype)
        shrunk_NR = fused.shrink(x_NI.to(y_NO.dtype))
        # add_ on the slice: `y[:, :w] += z` would also copy the sum back onto itself (Python's setitem)
        y_NO[:, : fused.b_RO.shape[1]].add_(fused.expand(shrunk_NR if scale == 1.0 else shrunk_NR.mul_(scale)))
        return
    a_LRI = torch.cat(lora_a_stacked, dim=-2) if len(lora_a_stacked) > 1 else lora_a_stacked[0]
    expand_dtype = torch.float32 if x_NI.shape[0] <= EXPAND_FLOAT32_ROWS else y_NO.dtype
    shrunk_NR = grouped_lora_products(x_NI, a_LRI, indices).to(expand_dtype).mul_(scale)
    rank_offset, output_offset = 0, 0
    for a, b, size in zip(lora_a_stacked, lora_b_stacked, output_slices, strict=True):
        rank = a.shape[-2]
        y_NO[:, output_offset : output_offset + size].add_(
            grouped_lora_products(shrunk_NR[:, rank_offset : rank_offset + rank], b, indices, expand_dtype)
        )
        rank_offset, output_offset = rank_offset + rank, output_offset + size


OPS = {
    "bgmv_shrink": bgmv_shrink,
    "bgmv_expand": bgmv_expand,
    "bgmv_expand_slice": bgmv_expand_slice,
    "sgmv_shrink": sgmv_shrink,
    "sgmv_expand": sgmv_expand,
    "sgmv_expand_slice": sgmv_expand_slice,
}


def register() -> None:
    """vLLM's plugin hook: swap in the grouped ops where `AGENTRL_VLLM_GROUPED_LORA=1`."""
    if os.environ.get(ENV) != "1":
        return
    try:
        from vllm.lora.ops import torch_ops
        from vllm.lora.ops.torch_ops import lora_ops
        from vllm.lora.punica_wrapper import punica_cpu
    except ImportError as error:  # another vLLM layout: keep its own ops
        logger.warning("agentrl: vLLM's CPU LoRA ops not found (%s); using vLLM's", error)
        return
    for module in (lora_ops, torch_ops, punica_cpu):
        for name, function in OPS.items():
            if hasattr(module, name):
                setattr(module, name, function)
    punica_cpu.PunicaWrapperCPU.add_lora_linear = add_lora_linear  # type: ignore[method-assign,assignment]
    logger.warning("agentrl: grouped CPU LoRA ops in use (%s=1)", ENV)
