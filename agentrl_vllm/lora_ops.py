"""A vLLM plugin: on a CPU, multiply each adapter's tokens by its LoRA weights in one matmul.

vLLM's CPU LoRA ops (`vllm.lora.ops.torch_ops`) gather a copy of the LoRA matrix for every token
(`weights[indices]`) and contract them one token at a time (`einsum("bi, boi -> bo")`). In a
rollout phase every token uses the same adapter, so this version groups tokens by adapter index
and does one matmul per group (one in practice); the results and the post-processing are the
same. `benchmarks/sampling.py` measures the effect on the adapter's throughput.

Loaded by vLLM in each of its processes through the `vllm.general_plugins` entry point, and active
only where the environment sets `AGENTRL_VLLM_GROUPED_LORA=1` (agentrl's CPU servers do; set it to
0 to compare), so other vLLM servers on the machine are left alone.
"""

from __future__ import annotations

import logging
import os

import torch

ENV = "AGENTRL_VLLM_GROUPED_LORA"
logger = logging.getLogger(__name__)


def grouped_lora_products(
    inputs_NI: torch.Tensor, weights: torch.Tensor, indices_N: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """Row n of the result is inputs[n] @ weights[indices[n]]^T, computed one matmul per distinct index.

    `weights` is (L, O, I) or (L, 1, O, I); indices index it as Python does (so -1 is the last).
    """
    weights_LOI = weights.squeeze(1) if weights.dim() == 4 else weights
    inputs_NI = inputs_NI.to(dtype)
    values = torch.unique(indices_N).tolist()
    if len(values) == 1:
        return inputs_NI @ weights_LOI[values[0]].to(dtype).t()
    outputs_NO = inputs_NI.new_empty(inputs_NI.shape[0], weights_LOI.shape[1])
    for value in values:
        rows = (indices_N == value).nonzero().squeeze(1)
        outputs_NO[rows] = inputs_NI[rows] @ weights_LOI[value].to(dtype).t()
    return outputs_NO


def bgmv_shrink(
    inputs: torch.Tensor,
    lora_a_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    scaling: float = 1.0,
) -> None:
    outputs = grouped_lora_products(inputs, lora_a_weights, lora_indices_tensor, output_tensor.dtype)
    output_tensor[:, : outputs.shape[1]] = scaling * outputs


def bgmv_expand(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    add_inputs: bool = True,
) -> None:
    outputs = grouped_lora_products(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
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
    lora_indices_tensor: torch.Tensor,
    slice_offset: int,
    slice_size: int,
    add_inputs: bool = True,
) -> None:
    outputs = grouped_lora_products(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if add_inputs:
        output_tensor[:, slice_offset : slice_offset + slice_size] += outputs
    else:
        output_tensor[:, slice_offset : slice_offset + slice_size] = outputs


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
        for name, function in (
            ("bgmv_shrink", bgmv_shrink),
            ("bgmv_expand", bgmv_expand),
            ("bgmv_expand_slice", bgmv_expand_slice),
        ):
            if hasattr(module, name):
                setattr(module, name, function)
    logger.warning("agentrl: grouped CPU LoRA ops in use (%s=1)", ENV)
