"""LoRA layers computed in the activations' dtype, with the low-rank product fused into one addmm.

peft's LoRA Linear casts each bf16 input to its fp32 adapter weights' dtype, and autocast casts it
back for the matmul; then it scales the low-rank output and adds it to the base output. On a CPU
those are four passes over a (tokens x features) tensor per layer, and they took over a third of
a training step here (profile in benchmarks/train_throughput.py). This forward computes
y = base(x) + (x A^T)(s B)^T with A and B cast to the activations' dtype (small tensors) and the
second product accumulated into y by one addmm. The weights stay fp32 (AdamW's masters) and get
fp32 gradients through the casts; the matmuls are bf16, as they were under autocast already, and
as vLLM computes LoRA.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch


def _fused_lora_forward(self: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """Replaces `peft.tuners.lora.Linear.forward` on one layer (same arguments and semantics for plain LoRA)."""
    peft_forward: Callable[..., torch.Tensor] = self._peft_forward
    if self.disable_adapters or self.merged or kwargs.get("adapter_names") is not None:
        return peft_forward(x, *args, **kwargs)
    result: torch.Tensor = self.base_layer(x, *args, **kwargs)
    for name in self.active_adapters:
        if name not in self.lora_A.keys():
            continue
        if name in self.lora_variant:  # DoRA and other variants: peft's own path
            return peft_forward(x, *args, **kwargs)
        dtype = result.dtype
        a_RI = self.lora_A[name].weight.to(dtype)
        b_scaled_OR = (self.lora_B[name].weight * self.scaling[name]).to(dtype)
        x_NI = self.lora_dropout[name](x).to(dtype).reshape(-1, x.shape[-1])
        result_NO = torch.addmm(result.reshape(-1, result.shape[-1]), x_NI @ a_RI.t(), b_scaled_OR.t())
        result = result_NO.view(result.shape)
    return result


def fuse_lora_layers(model: torch.nn.Module) -> None:
    """Give every peft LoRA Linear in `model` the fused forward.

    Idempotent, and it covers adapters added later (they live in the same layers' dicts).
    """
    from peft.tuners.lora.layer import Linear as LoraLinear

    for module in model.modules():
        if type(module) is LoraLinear and not hasattr(module, "_peft_forward"):
            module._peft_forward = module.forward  # type: ignore[assignment]
            module.forward = types.MethodType(_fused_lora_forward, module)  # type: ignore[method-assign]
