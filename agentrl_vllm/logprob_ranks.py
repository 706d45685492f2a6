"""A vLLM plugin: on a CPU, the rank of each sampled token counted eagerly, not through torch.compile.

For every token it returns logprobs for, vLLM's sampler counts the vocabulary entries whose logprob is
at least the token's (`batched_count_greater_than`), in a function wrapped in `torch.compile`. Every
agentrl request asks for logprobs, so a server's first request traced and compiled it in the engine
process: 1.7-1.9 s of Dynamo and Inductor on a 2-core bf16 EPYC, paid by every server's first
completion. The eager count is the same comparison and sum; the (sequences, vocabulary) boolean it
makes is 3 MB at 64 sequences of the packaged model.

Loaded by vLLM through the `vllm.general_plugins` entry point, active only where the environment sets
`AGENTRL_VLLM_EAGER_LOGPROB_RANKS=1` (agentrl's CPU servers do).
"""

from __future__ import annotations

import logging
import os

import torch

ENV = "AGENTRL_VLLM_EAGER_LOGPROB_RANKS"
logger = logging.getLogger(__name__)


def count_at_least(logprobs_NV: torch.Tensor, values_N1: torch.Tensor) -> torch.Tensor:
    """Per row n, how many of logprobs_NV[n] are >= values_N1[n]: the sampled token's rank (1 = the most likely)."""
    return (logprobs_NV >= values_N1).sum(-1)


def register() -> None:
    """vLLM's plugin hook: the sampler counts ranks with `count_at_least` where `ENV` is 1."""
    if os.environ.get(ENV) != "1":
        return
    try:
        from vllm.v1.sample import sampler
    except ImportError as error:  # another vLLM layout: keep its own count
        logger.warning("agentrl: vLLM's sampler not found (%s); its compiled rank count is used", error)
        return
    if not hasattr(sampler, "batched_count_greater_than"):
        logger.warning("agentrl: vLLM's sampler counts ranks another way; left as it is")
        return
    sampler.batched_count_greater_than = count_at_least
    logger.warning("agentrl: logprob ranks counted eagerly (%s=1)", ENV)
