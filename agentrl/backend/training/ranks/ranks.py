"""Trainer ranks: M trainer processes under `torch.distributed`, driven by the backend as one trainer.

Each rank is a spawned process holding a full `Trainer` (the frozen base and every adapter) in one
process group (gloo on CPU, NCCL on GPUs). The backend sends every call to all ranks at once; in a
step each rank trains on its token-balanced share of the sequences and the ranks sum gradients, so
every rank applies the same update and holds the same weights. Sharded (`sharded=True`, FSDP2, see
`agentrl.backend.training.step.sharding`), each rank holds 1/M of the decoder layers instead, and calls that touch
the layers run on every rank together. Rank 0 alone writes checkpoints; every rank loads one on
resume. A rank that dies stops them all and says which, with its exit code: the run resumes from
its last checkpoint by registering the model again. Ranks may also join from other hosts
(`agentrl.backend.training.ranks.rank_hosts`): the backend then drives them the same way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import multiprocessing
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, NoReturn

import torch

from agentrl.backend.processes import free_port, split_contiguous
from agentrl.backend.training.adapter_trainer import StepOutcome
from agentrl.backend.training.ranks.rank_hosts import (
    JoinPoint,
    ShippedFolder,
    accept_ranks,
    send_by_value,
)
from agentrl.backend.training.ranks.rank_links import LocalRank, RemoteRank
from agentrl.backend.training.ranks.rank_process import serve_rank
from agentrl.data.trajectory import History
from agentrl.data.trajectory_group import TrajectoryGroup
from agentrl.foundation.config import LoRAConfig, TrainConfig
from agentrl.foundation.errors import ConfigurationError, TrainingError
from agentrl.foundation.timeline import recorder

logger = logging.getLogger(__name__)

POLL_S = 0.5
"""How often the driver checks that every rank still lives while it waits for answers."""
FAILED_GRACE_S = 2.0
"""Ranks' time to stop once one failed: one waiting in a collective for it never answers, so it is killed sooner."""


def rank_devices(device: str | None, ranks: int, *, gpu_count: int) -> list[str]:
    """The device of each rank: consecutive GPUs from `device` ("cuda:1" -> cuda:1, cuda:2, ...), or the CPU.

    With no `device`, GPUs when the machine has them (from cuda:0), else the CPU for every rank.
    Asking for more GPUs than the machine has is a ConfigurationError naming both numbers.
    """
    device = device or ("cuda:0" if gpu_count else "cpu")
    kind, _, index = device.partition(":")
    if kind != "cuda":
        if ranks > 1 and kind != "cpu":
            raise ConfigurationError(f"trainer ranks run on 'cpu' or 'cuda[:N]' devices, not {device!r}")
        return [device] * ranks
    first = int(index or 0)
    if first + ranks > gpu_count:
        raise ConfigurationError(
            f"{ranks} trainer ranks from {device} need GPUs {first}..{first + ranks - 1}; this machine has "
            f"{gpu_count}. Lower trainer_ranks or start from a lower trainer_device"
        )
    return [f"cuda:{first + rank}" for rank in range(ranks)]


def rank_cpus(cpus: Sequence[int], ranks: int) -> list[list[int]]:
    """Each CPU rank's own cores (contiguous, sizes within one): ranks never share a core's threads.

    With fewer cores than ranks, each rank gets one core, shared round-robin (slow, but it runs).
    """
    cpus = sorted(cpus)
    if len(cpus) < ranks:
        return [[cpus[rank % len(cpus)]] for rank in range(ranks)]
    return split_contiguous(cpus, ranks)


class TrainerRanks:
    """`ranks` trainer processes driven like one `Trainer`: same methods, the same update as one rank.

    `device` is the first rank's device ("cuda:1": ranks on cuda:1, cuda:2, ...; the CPU by
    default without GPUs, each rank then on its own share of this process's cores). `sharded`
    shards the decoder layers over the ranks (FSDP2) for a model too large for one device. With
    `join`, the last `join.remote_ranks` ranks are on other hosts: they join at `join`'s address
    (`agentrl backend rank --join HOST:PORT`) and torch.distributed meets at a TCP store there.
    """

    def __init__(
        self,
        model_path: str,
        *,
        ranks: int,
        seed: int = 0,
        device: str | None = None,
        sharded: bool = False,
        deterministic: bool = False,
        join: JoinPoint | None = None,
        startup_timeout_s: float = 600.0,
    ) -> None:
        if ranks < 2:
            raise ConfigurationError(f"TrainerRanks is for 2 or more ranks (got {ranks}); use Trainer for one")
        local = ranks - (join.remote_ranks if join is not None else 0)
        if local < 1:
            raise ConfigurationError(
                f"{ranks} trainer ranks with {ranks - local} on other hosts leave none here: rank 0 runs on the head"
            )
        gpu_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        self.devices = rank_devices(device, local, gpu_count=gpu_count)
        cpus = list(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
        shares = rank_cpus(cpus, local)
        self._folder = Path(tempfile.mkdtemp(prefix="agentrl-ranks-"))
        rendezvous = (self._folder / "rendezvous").as_uri()
        if join is not None:  # a TCP store on the head, which rank 0 keeps
            rendezvous = f"tcp://{join.host}:{free_port(join.host)}"
        context = multiprocessing.get_context("spawn")  # never fork a process that holds torch threads
        self._connections: list[Connection] = []
        self._links: list[LocalRank | RemoteRank] = []
        self._broken: str | None = None
        self.sharded = sharded
        trainer_args = {"model_path": model_path, "seed": seed, "sharded": sharded, "deterministic": deterministic}
        for rank in range(local):
            ours, theirs = context.Pipe()
            process = context.Process(
                target=serve_rank,
                args=(rank, ranks, rendezvous, self.devices[rank], shares[rank], theirs, trainer_args),
                name=f"agentrl-trainer-rank{rank}",
                daemon=True,
            )
            process.start()
            theirs.close()
            self._connections.append(ours)
            self._links.append(LocalRank(process))
        if join is not None:
            try:
                joined = accept_ranks(
                    join, list(range(local, ranks)), ranks, rendezvous, trainer_args, timeout_s=startup_timeout_s
                )
            except BaseException:
                self.close()
                raise
            for connection, remote in joined:
                self._connections.append(connection)
                self._links.append(remote)
                self.devices.append(f"host {remote.host}")
        self.pids: list[int] = self._collect(list(range(ranks)), "start", timeout_s=startup_timeout_s)
        logger.info("%d trainer ranks on %s (pids %s)", ranks, ", ".join(self.devices), self.pids)

    @property
    def world_size(self) -> int:
        return len(self._links)

    # --- the Trainer's methods, on every rank or on rank 0 ---

    def add_adapter(self, name: str, lora: LoRAConfig) -> None:
        self._call(self._all, "add_adapter", name, lora)

    def load(self, name: str, folder: Path) -> None:
        """Every rank loads the checkpoint; a rank on another host gets its files over its connection."""
        remote = any(isinstance(link, RemoteRank) for link in self._links)
        self._call(self._all, "load", name, folder, remote_args=(name, ShippedFolder.of(folder)) if remote else None)

    def save(self, name: str, folder: Path) -> None:
        """Rank 0 writes the checkpoint (sharded, after gathering the whole tensors from every rank)."""
        self._call(self._through_layers, "save", name, folder)

    def train_step(self, name: str, groups: Sequence[TrajectoryGroup], config: TrainConfig) -> StepOutcome:
        outcome: StepOutcome = self._call(self._all, "train_step", name, list(groups), config)[0]
        return outcome

    def sft_step(
        self,
        name: str,
        histories: Sequence[History],
        *,
        learning_rate: float,
        micro_batch_tokens: int | None,
        shared_prefix: bool | None = None,
        assistant_turns: str = "all",
    ) -> StepOutcome:
        outcome: StepOutcome = self._call(
            self._all,
            "sft_step",
            name,
            list(histories),
            learning_rate=learning_rate,
            micro_batch_tokens=micro_batch_tokens,
            shared_prefix=shared_prefix,
            assistant_turns=assistant_turns,
        )[0]
        return outcome

    def logprobs_of(self, name: str, sequences: Sequence[Any]) -> list[list[float]]:
        result: list[list[float]] = self._call(self._through_layers, "logprobs_of", name, list(sequences))[0]
        return result

    def adapter_weights(self, name: str, rank: int | None = 0) -> dict[str, torch.Tensor]:
        """Rank `rank`'s whole weights of adapter `name` (peft's keys), to check that the ranks agree."""
        rank = 0 if rank is None else rank
        asked = self._all if self.sharded else [rank]
        weights: dict[str, torch.Tensor] = self._call(asked, "adapter_weights", name)[asked.index(rank)]
        return weights

    def parameter_bytes(self) -> list[int]:
        """Bytes of weights each rank holds (its shards, when sharded)."""
        return [size for one_rank in self._call(self._all, "parameter_bytes") for size in one_rank]

    # --- driving the ranks ---

    @property
    def _all(self) -> list[int]:
        return list(range(self.world_size))

    @property
    def _through_layers(self) -> list[int]:
        """Who runs a call that passes through the layers: rank 0 alone, or (sharded) every rank."""
        return self._all if self.sharded else [0]

    def _call(
        self, ranks: list[int], method: str, *args: Any, remote_args: tuple[Any, ...] | None = None, **kwargs: Any
    ) -> list[Any]:
        """Send the call to `ranks` (`remote_args` instead of `args` to ranks on other hosts) and return their
        answers, in rank order, once all have answered."""
        if self._broken is not None:
            raise TrainingError(self._broken)
        for rank in ranks:
            link, connection = self._links[rank], self._connections[rank]
            try:
                link.heard()  # its silence is counted from the call on
                if isinstance(link, RemoteRank):
                    send_by_value(connection, (method, args if remote_args is None else remote_args, kwargs))
                else:
                    connection.send((method, args, kwargs))
            except OSError:
                link.settle(5)
                self._fail(link.death(rank, method))
        return self._collect(ranks, method)

    def _collect(self, ranks: list[int], method: str, *, timeout_s: float | None = None) -> list[Any]:  # noqa: C901 - over the limit when the rule came on; split it when next changed
        """Every rank's answer to `method`, in rank order; a rank's error, death or silence is raised.

        After a rank's error the others get a short while to answer (they failed the same way) before
        they are judged stuck in a collective, and all ranks are stopped.
        """
        answers: dict[int, Any] = {}
        errors: dict[int, tuple[BaseException, str]] = {}
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while len(answers) + len(errors) < len(ranks):
            for rank in ranks:
                if rank in answers or rank in errors:
                    continue
                connection, link = self._connections[rank], self._links[rank]
                reply = None
                try:
                    if connection.poll(POLL_S / len(ranks)):
                        reply = connection.recv()
                except (EOFError, OSError):  # the rank's end closed: it died, or is dying
                    link.settle(5)
                    self._fail(link.death(rank, method))
                if reply is None:
                    if not link.alive():
                        self._fail(link.death(rank, method))
                elif reply[0] == "beat":  # a rank on another host, still at work
                    link.heard()
                elif reply[0] == "ok":
                    answers[rank] = reply[1]
                    for span in reply[2]:
                        recorder.add(dataclasses.replace(span, track=f"trainer rank {rank}"))
                else:
                    errors[rank] = (reply[1], reply[2])
                    deadline = min(deadline or math.inf, time.monotonic() + 30)
            if deadline is not None and time.monotonic() > deadline and len(answers) + len(errors) < len(ranks):
                silent = [r for r in ranks if r not in answers and r not in errors]
                reason = errors[min(errors)][0] if errors else None
                self._fail(f"trainer ranks {silent} did not answer {method}" + (f" after: {reason}" if reason else ""))
        if errors:
            rank = min(errors)
            error, trace = errors[rank]
            logger.debug("trainer rank %d failed in %s:\n%s", rank, method, trace)
            if method == "start":
                self._fail(f"trainer rank {rank} could not start: {type(error).__name__}: {error}\n{trace}")
            raise error
        return [answers[rank] for rank in ranks]

    def _fail(self, why: str) -> NoReturn:
        """Stop every rank and raise: the ranks' weights can no longer be trusted to agree."""
        self._broken = (
            f"{why}; all trainer ranks were stopped. Nothing after the last checkpoint was saved: close the "
            "backend and register the model again to resume from it"
        )
        self.close(grace_s=FAILED_GRACE_S)
        raise TrainingError(self._broken)

    def close(self, grace_s: float = 10.0) -> None:
        """Stop the ranks (asked, then killed after `grace_s`) and remove their rendezvous folder."""
        for connection in self._connections:
            with contextlib.suppress(OSError, BrokenPipeError):
                connection.send(("stop", (), {}))
        deadline = time.monotonic() + grace_s
        for link, connection in zip(self._links, self._connections, strict=True):
            link.settle(max(0.0, deadline - time.monotonic()))
            link.stop()
            connection.close()
        shutil.rmtree(self._folder, ignore_errors=True)
