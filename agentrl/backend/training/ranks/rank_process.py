"""A trainer rank's own process: placed on its device and cores, joined to the process group, it builds its
`Trainer` and runs the driver's calls (`ranks.TrainerRanks`) until told to stop, sending back each answer or
error. A rank spawned by the backend and one that joined from another host (`rank_joiner`) run the same loop."""

from __future__ import annotations

import contextlib
import faulthandler
import os
import pickle
import socket
import traceback
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any

import torch

from agentrl.backend.training.ranks.rank_hosts import BeatingConnection, is_loopback, run_shipped
from agentrl.foundation.errors import TrainingError
from agentrl.foundation.timeline import recorder

COLLECTIVE_TIMEOUT = timedelta(minutes=30)
"""How long a rank waits in a collective for the others (a longer step than this would be cut off)."""


def _portable_error(error: BaseException) -> BaseException:
    """`error` if it survives pickling (agentrl's errors do), else a TrainingError with its text."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:  # noqa: BLE001 - any exception may fail to pickle, in any way
        return TrainingError(f"{type(error).__name__}: {error}")


def keep_rank_sockets_on_loopback() -> None:
    """All ranks run on this host: their gloo and NCCL sockets listen on the loopback interface only (on a
    cloud host they would otherwise bind the interface the hostname resolves to), unless the user chose one."""
    names = {name for _, name in socket.if_nameindex()}
    loopback = next((name for name in ("lo", "lo0") if name in names), None)
    if loopback is not None:
        for variable in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
            os.environ.setdefault(variable, loopback)


def _place_rank(device: str, cpus: list[int] | None, rendezvous: str) -> None:
    """Put this rank's process on its device (and cores, if given), its sockets on loopback when every rank is
    on this machine; a native crash (gloo, a kernel) then prints every thread's Python stack."""
    faulthandler.enable()
    if device == "cpu" and cpus is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)
        torch.set_num_threads(len(cpus))
    elif device.startswith("cuda"):
        torch.cuda.set_device(device)
    if rendezvous.startswith("file:") or is_loopback(rendezvous.removeprefix("tcp://").rpartition(":")[0]):
        keep_rank_sockets_on_loopback()


def serve_rank(
    rank: int,
    world_size: int,
    rendezvous: str,
    device: str,
    cpus: list[int] | None,
    connection: Connection | BeatingConnection,
    trainer_args: dict[str, Any],
) -> None:
    """A rank's process: join the group, build its Trainer, then run the driver's calls until told to stop.

    `cpus`: the cores of a rank the backend spawned, which also dies with the backend; None for a rank
    that joined from another host, which uses its host's cores and lives as long as its connection."""
    from agentrl.backend.processes import die_with_parent
    from agentrl.backend.training.step_input import use_deterministic_kernels
    from agentrl.backend.training.trainer import Trainer

    if cpus is not None:
        die_with_parent()
    _place_rank(device, cpus, rendezvous)
    backend = "nccl" if device.startswith("cuda") else "gloo"
    try:
        torch.distributed.init_process_group(
            backend, init_method=rendezvous, rank=rank, world_size=world_size, timeout=COLLECTIVE_TIMEOUT
        )
        if trainer_args.pop("deterministic", False):  # each rank's process, before its first matmul
            use_deterministic_kernels()
        trainer = Trainer(**trainer_args, device=device)
        connection.send(("ok", os.getpid(), []))
        while True:
            try:
                method, args, kwargs = connection.recv()
            except EOFError:  # the driver is gone
                return
            if method == "stop":
                return
            try:
                answer = run_shipped(getattr(trainer, method), args, kwargs)
                connection.send(("ok", answer, recorder.take()))  # the driver puts its spans on this rank's track
            except Exception as error:  # noqa: BLE001 - every failure goes back to the driver, which raises it
                connection.send(("error", _portable_error(error), traceback.format_exc()))
    except Exception as error:  # noqa: BLE001 - a rank that cannot start says why
        with contextlib.suppress(OSError):
            connection.send(("error", _portable_error(error), traceback.format_exc()))
    finally:
        with contextlib.suppress(Exception):
            torch.distributed.destroy_process_group()
