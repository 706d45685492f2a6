"""The joining side of trainer ranks on other hosts: `agentrl backend rank --join HOST:PORT` connects to the
head, takes the rank it is given and serves it as the head's own ranks are served (`rank_process.serve_rank`)."""

from __future__ import annotations

import logging
import os
import socket
import time
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client
from pathlib import Path

from agentrl.backend.training.ranks.rank_hosts import BeatingConnection, parse_address
from agentrl.backend.training.ranks.rank_process import serve_rank
from agentrl.foundation.errors import ConfigurationError, TrainingError

logger = logging.getLogger(__name__)


def join_as_rank(address: str, token: str, *, model_path: str | None, device: str | None, wait_s: float) -> int:
    """Connect to the head at `address` (retrying until `wait_s`), take the rank it gives, and serve it until
    the head stops it or goes away; returns the rank served."""
    import torch

    host, port = parse_address(address)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            connection = Client((host, port), authkey=token.encode())
            break
        except (TimeoutError, ConnectionRefusedError, ConnectionResetError):
            if time.monotonic() > deadline:
                raise TrainingError(
                    f"no head listened at {address} within {wait_s:.0f} s: start its backend with trainer ranks "
                    "from other hosts first"
                ) from None
            time.sleep(1.0)
        except AuthenticationError as error:
            raise ConfigurationError(
                f"the head at {address} refused this rank's token ({error}): set AGENTRL_JOIN_TOKEN to the head's"
            ) from error
    connection.send(("hello", socket.gethostname(), os.getpid()))
    rank, world_size, rendezvous, trainer_args = connection.recv()
    if model_path is not None:
        trainer_args["model_path"] = model_path
    elif not Path(trainer_args["model_path"]).exists():
        connection.close()
        raise ConfigurationError(
            f"the head's model {trainer_args['model_path']} is not a folder on this host: pass --model with this "
            "host's copy of the same model"
        )
    # Under torchrun (one process per device of this host) LOCAL_RANK names this process's device; the head's
    # rendezvous, not torchrun's (its MASTER_ADDR, RANK and WORLD_SIZE are its own), makes the process group.
    device = device or (f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if torch.cuda.is_available() else "cpu")
    logger.info("serving trainer rank %d of %d on %s for the head at %s", rank, world_size, device, address)
    link = BeatingConnection(connection)
    try:
        serve_rank(rank, world_size, rendezvous, device, None, link, trainer_args)
    finally:
        link.close()
    return int(rank)
