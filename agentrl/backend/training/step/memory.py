"""A step that outgrows the GPU: the default micro-batch halved until the step's passes fit.

A base model larger than the default size was chosen for (16,384 tokens on a GPU) runs out of memory
in its first step; halving keeps the update the same (gradients accumulate over micro-batches) and
costs one retried step. A size the user set is theirs to change, so it raises instead.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

import torch

from agentrl.foundation.errors import TrainingError

logger = logging.getLogger(__name__)
Result = TypeVar("Result")

SMALLEST_MICRO_BATCH = 1024
"""Tokens per micro-batch below which running out of memory is an error, not a reason to halve again."""


def within_memory(
    passes: Callable[[int], Result],
    *,
    requested: int | None,
    default: int,
    can_halve: bool,
    device: torch.device,
    drop_gradients: Callable[[], None],
) -> tuple[Result, int]:
    """`passes(max_tokens)`, a step's forward and backward passes, at `requested` tokens per micro-batch
    or else `default`. Where the default runs out of memory (and `can_halve`: ranks must agree on one
    plan), the partial gradients are dropped and the passes run again at half the size. Returns their
    result and the default for later steps (halved for good where it did not fit)."""
    while True:
        max_tokens = requested or default
        try:
            return passes(max_tokens), default
        except torch.OutOfMemoryError as error:
            drop_gradients()  # the failed attempt's partial gradients
            smaller = max_tokens // 2
            if requested is not None or not can_halve or smaller < SMALLEST_MICRO_BATCH:
                raise TrainingError(
                    f"a micro-batch of {max_tokens} tokens ran out of memory on {device}; set "
                    f"TrainConfig(micro_batch_tokens=...) lower (e.g. {smaller}), or use a smaller base "
                    f"model or shorter rollouts ({error})"
                ) from error
        torch.cuda.empty_cache()
        logger.warning(
            "a micro-batch of %d tokens ran out of memory on %s: %d tokens per micro-batch from now on "
            "(TrainConfig.micro_batch_tokens sets it)",
            max_tokens,
            device,
            smaller,
        )
        default = smaller
