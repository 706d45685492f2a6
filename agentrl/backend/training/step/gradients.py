"""The end of a step: the ranks' gradients and running sums added up, then clipped and applied, or dropped
whole when the loss or the gradient norm is not finite."""

from __future__ import annotations

import ctypes
import math
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from agentrl.backend.training.step.sharding import clip_sharded_gradients, is_sharded
from agentrl.foundation.errors import TrainingError

if TYPE_CHECKING:
    from agentrl.foundation.config import TrainConfig


@dataclass
class Adapter:
    """One model's LoRA adapter on the shared base: its trainable tensors and their AdamW state."""

    parameters: list[torch.nn.Parameter]
    optimizer: torch.optim.AdamW


def release_freed_memory() -> None:
    """Hand memory that torch freed back to the OS (glibc keeps it otherwise; Linux only).

    Between steps a trainer needs only its weights, yet glibc holds on to the step's peak: measured
    here, a trainer process sat at 6.8-7.3 GB after training, and with a second process doing the
    same (a notebook beside the test suite) the machine ran down to 1 GB free.
    """
    if sys.platform == "linux":
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def read_sums(sums: dict[str, torch.Tensor]) -> dict[str, float]:
    """The step's running sums as floats, read from the device in one transfer."""
    return dict(zip(sums, torch.stack(list(sums.values())).float().tolist(), strict=True))


def most_across_ranks(count: int, device: torch.device) -> int:
    """The largest of the ranks' `count`s (every rank calls it: a collective)."""
    most = torch.tensor(count, device=device)
    dist.all_reduce(most, op=dist.ReduceOp.MAX)
    return int(most)


def sum_across_ranks(
    adapter: Adapter, sums: dict[str, torch.Tensor], world_size: int, *, maxima: tuple[str, ...] = ()
) -> dict[str, float]:
    """Sum the ranks' gradients and running sums in place (the `maxima` among them: the largest of the
    ranks' values): DDP's all-reduce, done once per step.

    Done by hand, not by wrapping the model in DistributedDataParallel: ranks run different
    numbers of micro-batches (token-balanced shares), and the trainable tensors change with the
    active adapter, neither of which DDP's per-backward hooks allow. One flat tensor, one call.
    Returns the time it took and the bytes summed (the ranks' coordination cost) as metrics; nothing alone.
    """
    if world_size == 1:
        return {}
    started = time.perf_counter()
    whole_parameters = [p for p in adapter.parameters if not is_sharded(p)]  # shards were summed in backward
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in whole_parameters]
    summed = [name for name in sums if name not in maxima]
    flat = torch.cat([g.reshape(-1).float() for g in grads] + [torch.stack([sums[n] for n in summed]).float()])
    dist.all_reduce(flat)
    offset = 0
    for parameter, grad in zip(whole_parameters, grads, strict=True):
        parameter.grad = flat[offset : offset + grad.numel()].view_as(parameter).to(parameter.dtype)
        offset += grad.numel()
    for name, total in zip(summed, flat[offset:], strict=True):
        sums[name] = total
    if maxima:
        largest = torch.stack([sums[n] for n in maxima]).float()
        dist.all_reduce(largest, op=dist.ReduceOp.MAX)
        sums.update(zip(maxima, largest, strict=True))
    return {
        "trainer_ranks": float(world_size),
        "allreduce_s": time.perf_counter() - started,
        "allreduce_bytes": float(flat.numel() * flat.element_size()),  # what each rank sends, as a sum's input
    }


def _abort_if_not_finite(what: str, value: float, detail: str) -> None:
    if not math.isfinite(value):
        raise TrainingError(
            f"the step was aborted: its {what} is {value} ({detail}); nothing was applied or saved, the weights "
            "and optimizer state are as before the step, and the next valid step trains normally. Look for "
            "non-finite sampler logprobs in the trajectories, or lower the learning rate"
        )


def apply_gradients(adapter: Adapter, max_norm: float, *, loss: float, sharded: bool) -> float:
    """Clip and apply the accumulated gradients, unless the loss or gradient norm is not finite; returns the norm.

    A NaN that reached AdamW would turn every adapter weight (and its moments) into NaN, to be
    saved, served and resumed from. So a non-finite step is dropped whole: gradients cleared,
    weights and optimizer state untouched, `TrainingError` raised.
    """
    try:
        _abort_if_not_finite("loss", loss, "summed over the step's micro-batches")
        if sharded:
            grad_norm = clip_sharded_gradients(adapter.parameters, max_norm)
        else:
            grad_norm = float(torch.nn.utils.clip_grad_norm_(adapter.parameters, max_norm))
        _abort_if_not_finite("gradient norm", grad_norm, f"loss {loss:.4g}")
        adapter.optimizer.step()
        return grad_norm
    finally:
        adapter.optimizer.zero_grad(set_to_none=True)
        release_freed_memory()


def set_optimizer(adapter: Adapter, config: TrainConfig, *, num_sequences: int) -> float:
    """Give AdamW this step's settings from `config`, the learning rate scaled by the step's sequences
    (`learning_rate_sequence_power`); returns that learning rate."""
    learning_rate = float(config.learning_rate * num_sequences**config.learning_rate_sequence_power)
    for group in adapter.optimizer.param_groups:
        group.update(lr=learning_rate, weight_decay=config.weight_decay, betas=config.adam_betas, eps=config.adam_eps)
    return learning_rate
