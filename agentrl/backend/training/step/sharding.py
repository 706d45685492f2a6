"""Sharded trainer ranks (FSDP2's `fully_shard`): each rank holds 1/M of every decoder layer.

For a base model that does not fit one device: the decoder layers (the bulk of the weights) are
sharded over the ranks and gathered layer by layer in forward and backward; the embeddings, final
norm and head stay whole on every rank. LoRA tensors live in the layers, so their gradients and
AdamW moments are sharded too. Checkpoints are written whole (the same files as one rank's), so a
run may resume with any number of ranks, sharded or not.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, distribute_tensor

from agentrl.backend.precision import bf16_is_native
from agentrl.foundation.errors import ConfigurationError


def shard_decoder_layers(causal_lm: Any, device: torch.device, world_size: int) -> None:
    """Shard each decoder layer of `causal_lm` over the process group and put the rest on `device`.

    Gradients are summed over ranks, not averaged (the loss already divides by the whole step's
    denominator); bf16 compute and fp32 gradient reduction, as autocast gives one rank.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    layers = getattr(getattr(causal_lm, "model", None), "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise ConfigurationError(
            f"sharded trainer ranks need a decoder with `model.layers` (Llama, Qwen, Mistral, SmolLM...); "
            f"{type(causal_lm).__name__} has none. Train it with unsharded ranks"
        )
    mesh = init_device_mesh(device.type, (world_size,))
    compute = torch.bfloat16 if bf16_is_native(device.type) else torch.float32  # as one rank computes
    policy = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32)
    # Each layer, then the decoder as the root (embeddings and final norm): the root gathers its own
    # weights once per pass and each layer its own in turn, freed after use. The head stays outside
    # (token_logprobs calls it only at loss positions), whole on every rank; a head tied to the
    # embeddings keeps its own whole copy there.
    for module in [*layers, causal_lm.model]:
        sharded = fully_shard(module, mesh=mesh, mp_policy=policy)
        sharded.set_gradient_divide_factor(1.0)
        sharded.set_force_sum_reduction_for_comms(True)  # gloo has no pre-multiplied sum
    causal_lm.to(device)  # the head; the shards are already there


def is_sharded(tensor: torch.Tensor) -> bool:
    """Whether `tensor` is one rank's shard (a DTensor) rather than a whole tensor."""
    return isinstance(tensor, DTensor)


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """The full tensor behind a shard (a collective: every rank must call it, in the same order)."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def like(full: torch.Tensor, parameter: torch.Tensor) -> torch.Tensor:
    """`full` laid out as `parameter` is: this rank's shard of it for a sharded parameter."""
    full = full.to(device=parameter.device, dtype=parameter.dtype)
    if isinstance(parameter, DTensor):
        return distribute_tensor(full, parameter.device_mesh, parameter.placements)
    return full


def clip_sharded_gradients(parameters: list[torch.nn.Parameter], max_norm: float) -> float:
    """Clip gradients to a global norm over the ranks' shards (whole gradients count once); returns it."""
    sharded_sq = torch.zeros((), dtype=torch.float32, device=parameters[0].device)
    whole_sq = torch.zeros_like(sharded_sq)
    for parameter in parameters:
        grad = parameter.grad
        if grad is None:
            continue
        if isinstance(grad, DTensor):
            sharded_sq += grad.to_local().float().square().sum()
        else:
            whole_sq += grad.float().square().sum()
    dist.all_reduce(sharded_sq)
    norm = float((sharded_sq + whole_sq).sqrt())
    scale = max_norm / (norm + 1e-6)  # as torch.nn.utils.clip_grad_norm_ does
    if scale < 1.0:
        for parameter in parameters:
            if parameter.grad is not None:
                parameter.grad.mul_(scale)
    return norm


def whole_optimizer_state(optimizer_state: dict[str, Any]) -> dict[str, Any]:
    """A sharded adapter's AdamW state with whole moments on the CPU, as a checkpoint holds them (new
    dicts: `state_dict()` shares its inner dicts with the live optimizer)."""
    moments_by_index = optimizer_state["state"].items()
    state = {
        i: {k: v if k == "step" else whole(v).cpu() for k, v in moments.items()} for i, moments in moments_by_index
    }
    return {**optimizer_state, "state": state}


def load_shards(
    weights: dict[str, torch.Tensor],
    parameters_by_key: dict[str, torch.nn.Parameter],
    optimizer_state: dict[str, Any],
    parameters: list[torch.nn.Parameter],
) -> None:
    """Keep this rank's shard of whole checkpoint tensors: `weights` copied into the adapter's parameters
    (by checkpoint key), and the AdamW moments of `optimizer_state` cut like `parameters`, in place."""
    with torch.no_grad():
        for key, value in weights.items():
            parameters_by_key[key].copy_(like(value, parameters_by_key[key]))
    for index, moments in optimizer_state["state"].items():
        for key, value in moments.items():
            if key != "step":
                moments[key] = like(value, parameters[index])
