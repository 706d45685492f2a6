"""A vLLM plugin: under a grammar, the logprobs vLLM returns are the model's own, taken before the grammar's mask.

vLLM masks the logits of a constrained request (a forced or strict tool call, `structured_outputs`,
`response_format`) with the grammar's bitmask before its sampler computes the logprobs it returns, so a token the
grammar forces comes back with logprob 0 and every allowed token renormalised over the allowed ones. The trainer
scores a sequence with the model alone, without the grammar: on a forced tool call that gap averaged 0.71 nats a
token (max 19.8) on the packaged model, where the unconstrained answer after it was 0.04. With this plugin the
sampler's logprobs are computed from the logits as the model gave them; the token is still sampled from the masked
ones. The trainer then sees an importance ratio of about 1 on a constrained turn at step 0, and its gradient
raises the model's own probability of the calls it is rewarded for, so the format is learned, not only imposed.

Loaded by vLLM through the `vllm.general_plugins` entry point, active where the environment sets
`AGENTRL_VLLM_MODEL_LOGPROBS=1` (agentrl's servers do).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

ENV = "AGENTRL_VLLM_MODEL_LOGPROBS"
logger = logging.getLogger(__name__)


class _BeforeMask:
    """The last masked logits tensor (by identity) and its copy taken just before the mask; one engine thread."""

    masked: torch.Tensor | None = None
    logits: torch.Tensor | None = None


def _keeping_logits(apply_mask: Any) -> Any:
    def apply(scheduler_output: Any, grammar_output: Any, input_batch: Any, logits: torch.Tensor) -> None:
        _BeforeMask.masked, _BeforeMask.logits = logits, logits.clone()
        apply_mask(scheduler_output, grammar_output, input_batch, logits)

    return apply


def _from_logits_before_mask(compute_logprobs: Any) -> Any:
    def compute(logits: torch.Tensor) -> torch.Tensor:
        if logits is _BeforeMask.masked and _BeforeMask.logits is not None:
            logits = _BeforeMask.logits
        _BeforeMask.masked = _BeforeMask.logits = None
        logprobs: torch.Tensor = compute_logprobs(logits)
        return logprobs

    return staticmethod(compute)


def register() -> None:
    """vLLM's plugin hook: the sampler's returned logprobs come from the unmasked logits where `ENV` is 1."""
    if os.environ.get(ENV) != "1":
        return
    try:
        from vllm.v1.sample.sampler import Sampler
        from vllm.v1.worker import gpu_model_runner
    except ImportError as error:  # another vLLM layout: its masked logprobs stay, and the trainer's ratios show it
        logger.warning("agentrl: vLLM's model runner not found (%s); logprobs under a grammar stay masked", error)
        return
    if not hasattr(gpu_model_runner, "apply_grammar_bitmask") or not hasattr(Sampler, "compute_logprobs"):
        logger.warning("agentrl: vLLM masks grammars another way; logprobs under a grammar stay masked")
        return
    gpu_model_runner.apply_grammar_bitmask = _keeping_logits(gpu_model_runner.apply_grammar_bitmask)
    Sampler.compute_logprobs = _from_logits_before_mask(Sampler.compute_logprobs)  # type: ignore[method-assign]
    logger.warning("agentrl: logprobs under a grammar taken before its mask (%s=1)", ENV)
