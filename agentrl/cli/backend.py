"""`agentrl backend serve`: a LocalBackend and its gateway as a service for `RemoteBackend`."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import typer

from agentrl.cli.app import app
from agentrl.errors import ConfigurationError
from agentrl.run_folder import DEFAULT_BASE_PATH

backend_app = typer.Typer(no_args_is_help=True, help="Run a backend service that RemoteBackend trains on.")
app.add_typer(backend_app, name="backend")


BASE_MODELS_OPTION = typer.Option(  # a list option: one shared default object, not a call per signature
    None,
    help="a base model clients may register (repeat for several; the first is the default): the packaged name, "
    "a Hugging Face id or a folder on this host. Default: the packaged model",
)


@backend_app.command("serve")
def backend_serve(
    host: str = typer.Option("127.0.0.1", help="interface to listen on (0.0.0.0: every interface)"),
    port: int = typer.Option(8000, help="port for the gateway (/v1) and the backend's routes (/backend)"),
    runs: str = typer.Option(DEFAULT_BASE_PATH, help="root folder of the runs it trains; its token file lives here"),
    seed: int = typer.Option(0, help="seed of new adapters"),
    trainer_device: str = typer.Option(
        "", help="the trainer's device, e.g. cuda:1 (a GPU the servers do not use: sampling goes on while it trains)"
    ),
    trainer_ranks: int = typer.Option(
        1, min=1, help="data-parallel trainer processes (torch.distributed; on GPUs, one per device from the first)"
    ),
    shard_trainer: bool = typer.Option(
        False, help="shard the model's layers over the trainer ranks (FSDP2), for a model too large for one device"
    ),
    remote_ranks: int = typer.Option(
        0, min=0, help="how many of the trainer ranks join from other hosts (agentrl backend rank --join RANK_JOIN)"
    ),
    rank_join: str = typer.Option(
        "", help="HOST:PORT on this host where ranks from other hosts join (HOST: the address they reach it at)"
    ),
    base_model: list[str] = BASE_MODELS_OPTION,
    server_config: str | None = typer.Option(
        None, help="JSON file of ServerConfig fields (context, parser, extra vLLM flags, ...); clients cannot change it"
    ),
    max_lora_rank: int = typer.Option(64, min=1, help="the largest LoRA rank a client may register"),
) -> None:
    """Serve a LocalBackend and its gateway on HOST:PORT for `agentrl.RemoteBackend("http://HOST:PORT")`.

    Its admin token comes from AGENTRL_TOKEN, or is generated once and kept (mode 0600) in
    RUNS/backend.token; it opens every route. Rollouts get a sampling token (AGENTRL_SAMPLING_TOKEN, or
    derived from the admin token) that opens /v1 only. The base models, server settings and LoRA rank
    are the operator's: clients choose within them. Trainer ranks from other hosts present
    AGENTRL_RANK_TOKEN, set to the same value here and there. Ctrl-C stops it."""
    from agentrl.backend.remote.service import OperatorPolicy, serve_backend
    from agentrl.backend.training.rank_hosts import rank_join_point
    from agentrl.config import ServerConfig

    try:
        join = rank_join_point(rank_join, remote_ranks, os.environ.get("AGENTRL_RANK_TOKEN", ""))
    except ConfigurationError as error:
        raise typer.BadParameter(str(error)) from error
    try:
        server = ServerConfig()
        if server_config is not None:
            server = ServerConfig.model_validate_json(Path(server_config).read_text())
        policy = OperatorPolicy(
            base_models=tuple(base_model or OperatorPolicy().base_models), server=server, max_lora_rank=max_lora_rank
        )
    except (OSError, ValueError) as error:
        raise typer.BadParameter(f"--server-config {server_config}: {error}") from error
    try:
        asyncio.run(
            serve_backend(
                Path(runs),
                host=host,
                port=port,
                policy=policy,
                seed=seed,
                trainer_device=trainer_device or None,
                trainer_ranks=trainer_ranks,
                shard_trainer=shard_trainer,
                trainer_join=join,
            )
        )
    except KeyboardInterrupt:
        pass
    except ConfigurationError as error:
        raise typer.BadParameter(str(error)) from error


@backend_app.command("rank")
def backend_rank(
    join: str = typer.Option(..., help="HOST:PORT where the head's backend waits for trainer ranks from other hosts"),
    model: str | None = typer.Option(None, help="this host's copy of the base model (default: the head's folder)"),
    device: str = typer.Option("", help="this rank's device (default: cuda:0 where this host has a GPU, else the CPU)"),
    threads: int = typer.Option(0, min=0, help="CPU threads for this rank (default: torch's, every core)"),
    wait: float = typer.Option(600.0, min=0, help="seconds to keep trying to reach the head"),
) -> None:
    """Join a head's trainer as one rank from this host, and serve it until the head stops it or goes away.

    The head gives the rank its number, the torch.distributed rendezvous and the trainer's settings; both
    sides hold the same AGENTRL_RANK_TOKEN. Run it again (or under a supervisor) to rejoin after a restart."""
    import logging

    import torch

    from agentrl.backend.training.rank_joiner import join_as_rank
    from agentrl.errors import TrainingError

    token = os.environ.get("AGENTRL_RANK_TOKEN", "")
    if not token:
        raise typer.BadParameter("set AGENTRL_RANK_TOKEN to the head's rank token (the same value on every host)")
    if threads:
        torch.set_num_threads(threads)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        rank = join_as_rank(join, token, model_path=model, device=device or None, wait_s=wait)
    except ConfigurationError as error:
        raise typer.BadParameter(str(error)) from error
    except TrainingError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from error
    typer.echo(f"trainer rank {rank} done: the head at {join} stopped it or went away")
