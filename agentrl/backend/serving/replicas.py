"""A model's vLLM servers, one or several replicas, driven as one by the backend.

Replicas are plain vLLM servers (`VLLMServer`), each pinned to its own cores (CPU) or devices (GPU);
the gateway balances requests over them. Every adapter is loaded into each live replica before the
backend serves its name, so no request for `name@step` reaches a replica that lacks it. A replica
whose process dies is skipped (the gateway takes it out of rotation and logs its notice); the run
stops only when none is left. Replicas on other hosts join at any time (`admit`, remote_replica.py):
each takes every served adapter before it enters the rotation.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from agentrl.backend.processes import split_contiguous
from agentrl.backend.serving.remote_replica import RemoteReplica
from agentrl.backend.serving.server import VLLMServer, cuda_available
from agentrl.foundation.config import ServerConfig
from agentrl.foundation.errors import ConfigurationError, ServerError
from agentrl.gateway.upstream import Replica, ReplicaOffer

logger = logging.getLogger(__name__)


def placements(config: ServerConfig, *, gpu: bool, cpus: list[int], gpu_count: int) -> list[dict[str, str]]:
    """The environment that pins each replica: on a CPU its share of `cpus` (vLLM's
    `VLLM_CPU_OMP_THREADS_BIND`, ranks of one replica split by "|"), on GPUs its own
    `tensor_parallel_size x data_parallel_size` devices (`CUDA_VISIBLE_DEVICES`). One replica of one
    rank is left to vLLM's own defaults."""
    ranks = config.tensor_parallel_size * config.data_parallel_size
    if config.replicas == 1 and ranks == 1:
        return [{}]
    if gpu:
        needed = config.replicas * ranks
        if needed > gpu_count:
            raise ConfigurationError(
                f"{config.replicas} replica(s) x tensor_parallel_size {config.tensor_parallel_size} x "
                f"data_parallel_size {config.data_parallel_size} need {needed} GPUs; this machine has {gpu_count}. "
                "Lower ServerConfig.replicas or the parallel sizes"
            )
        groups = split_contiguous(list(range(needed)), config.replicas)
        return [{"CUDA_VISIBLE_DEVICES": ",".join(map(str, group))} for group in groups]
    if config.replicas * ranks > len(cpus):
        raise ConfigurationError(
            f"{config.replicas} replica(s) of {ranks} rank(s) need a core each, and this process may use "
            f"{len(cpus)} ({cpus}); lower ServerConfig.replicas"
        )
    binds = []
    for share in split_contiguous(cpus, config.replicas):
        binds.append("|".join(",".join(map(str, rank_cores)) for rank_cores in split_contiguous(share, ranks)))
    return [{"VLLM_CPU_OMP_THREADS_BIND": bind} for bind in binds]


class ServerReplicas:
    """The vLLM servers of one base model: started together, each adapter loaded into every live
    replica, a dead replica skipped while another serves."""

    def __init__(self, model_path: str, log_dir: Path, config: ServerConfig, *, max_lora_rank: int) -> None:
        self.gpu = cuda_available()
        gpu_count = 0
        if self.gpu:
            import torch

            gpu_count = torch.cuda.device_count()
        envs = placements(config, gpu=self.gpu, cpus=sorted(os.sched_getaffinity(0)), gpu_count=gpu_count)
        names = ["vllm.log"] if len(envs) == 1 else [f"vllm-{index}.log" for index in range(len(envs))]
        self.replicas: list[VLLMServer | RemoteReplica] = [
            VLLMServer(model_path, log_dir / name, config, max_lora_rank=max_lora_rank, placement=env)
            for name, env in zip(names, envs)
        ]
        self.model_path, self.config, self.served_name = model_path, config, "base"
        self.adapters: dict[str, Path] = {}
        """What every live replica serves, by name: a replica that joins takes each first."""
        self._changing = asyncio.Lock()  # an adapter loading, unloading, or a replica joining
        self._loop: asyncio.AbstractEventLoop | None = None  # the backend's, where joins run
        self.max_lora_rank = max_lora_rank
        self.devices = config.replicas * config.tensor_parallel_size * config.data_parallel_size
        """GPUs the replicas take, from cuda:0 up (on a GPU host; a trainer on a higher one has its own)."""

    @property
    def live(self) -> list[VLLMServer | RemoteReplica]:
        """Replicas whose process runs."""
        return [replica for replica in self.replicas if replica.death_notice() is None]

    def gateway_replicas(self) -> list[Replica]:
        """Where the gateway sends requests: each replica's address, key and death notice."""
        return [
            r.gateway_replica()
            if isinstance(r, RemoteReplica)
            else Replica(r.root_url, r.api_key, r.death_notice, track=f"replica {index}")
            for index, r in enumerate(self.replicas)
        ]

    def settings(self) -> dict[str, Any]:
        """What a replica on another host must serve (its agent starts its server with these)."""
        return {
            "model": self.model_path,
            "served_name": self.served_name,
            "server": self.config.model_dump(mode="json"),
            "max_lora_rank": self.max_lora_rank,
        }

    def admit(self, offer: ReplicaOffer) -> Future[Replica]:
        """`join` on the backend's loop, for the gateway's thread (replica_door.py)."""
        if self._loop is None:
            raise ServerError("the servers have not started")
        return asyncio.run_coroutine_threadsafe(self.join(offer), self._loop)

    async def join(self, offer: ReplicaOffer) -> Replica:
        """Take a replica from another host: load every served adapter into it, then count it among the live."""
        async with self._changing:
            remote = RemoteReplica(offer, track=f"replica {len(self.replicas)} on {offer.host}")
            try:
                for name, path in self.adapters.items():
                    await remote.load_adapter(name, path)
            except BaseException:
                remote.stop()
                raise
            self.replicas.append(remote)
        logger.info("%s joined, serving %d adapter(s)", remote.track, len(self.adapters))
        return remote.gateway_replica()

    async def start(self, served_name: str = "base") -> None:
        """Start every replica at once; if one fails, stop them all and raise its error (with its log)."""
        self._loop, self.served_name = asyncio.get_running_loop(), served_name
        local = [r for r in self.replicas if isinstance(r, VLLMServer)]  # all of them: others join once started
        results = await asyncio.gather(*(r.start(served_name) for r in local), return_exceptions=True)
        failed = [result for result in results if isinstance(result, BaseException)]
        if failed:
            self.stop()
            raise failed[0]

    async def _on_each_live(self, call: Callable[[VLLMServer | RemoteReplica], Awaitable[None]]) -> None:
        """`call` on every live replica; one that dies meanwhile is skipped, any other failure raised."""
        live = self.live
        results = await asyncio.gather(*(call(replica) for replica in live), return_exceptions=True)
        for replica, result in zip(live, results):
            if isinstance(result, BaseException):
                if isinstance(replica, RemoteReplica):  # ask its host now: gone, or a failure to raise
                    await asyncio.to_thread(replica.check)
                if replica.death_notice() is None:
                    raise result
                logger.warning("skipping a replica that died: %s", replica.death_notice())
        if not self.live:
            raise ServerError(self.death_notice() or "no vLLM server is running")

    async def load_adapter(self, name: str, path: Path) -> None:
        """Serve the LoRA in `path` as `name` on every live replica; returns once all have it.

        All or none: if any replica fails (or times out, when vLLM may have loaded it after all), `name` is
        unloaded from every live replica before the error is raised, so a retry can load it again (vLLM
        refuses a name already loaded) and no replica serves weights the backend rolled back."""
        async with self._changing:
            try:
                await self._on_each_live(lambda replica: replica.load_adapter(name, path))
            except BaseException:
                await asyncio.gather(*(replica.unload_adapter(name) for replica in self.live), return_exceptions=True)
                raise
            self.adapters[name] = path

    async def unload_adapter(self, name: str) -> None:
        """Stop serving `name` on every live replica."""
        async with self._changing:
            self.adapters.pop(name, None)
            await self._on_each_live(lambda replica: replica.unload_adapter(name))

    async def sleep(self, level: int = 1) -> None:
        """GPU only: every replica frees its memory for the trainer."""
        await self._on_each_live(lambda replica: replica.sleep(level))

    async def wake_up(self) -> None:
        """GPU only: every replica takes its memory back."""
        await self._on_each_live(lambda replica: replica.wake_up())

    def death_notice(self) -> str | None:
        """None while any replica runs; else what happened to each (log paths and tails)."""
        notices = [replica.death_notice() for replica in self.replicas]
        if any(notice is None for notice in notices):
            return None
        return "\n".join(notice for notice in notices if notice)

    def recent_log(self) -> str:
        """Each replica's last log lines, under its log's path."""
        return "\n".join(replica.recent_log() for replica in self.replicas)

    def stop(self) -> None:
        """End every replica, all at once (each waits for its engine to exit); safe to call twice. Replicas on
        other hosts drop this head's adapters, and none joins any more."""
        self._loop = None
        if len(self.replicas) == 1:
            self.replicas[0].stop()
            return
        with ThreadPoolExecutor(max_workers=len(self.replicas)) as pool:
            list(pool.map(lambda replica: replica.stop(), self.replicas))
