"""`agentrl backend serve`: a LocalBackend and its gateway as a service for `RemoteBackend`."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import typer

from agentrl.cli.app import app
from agentrl.foundation.errors import ConfigurationError
from agentrl.foundation.openmp_spin import BOUNDED_SPIN_TURNS, SPIN_VARIABLE, bound_openmp_spinning, spin_is_bounded
from agentrl.foundation.secret_tokens import check_token_strength
from agentrl.records.run_folder import DEFAULT_BASE_PATH

backend_app = typer.Typer(no_args_is_help=True, help="Run a backend service that RemoteBackend trains on.")
app.add_typer(backend_app, name="backend")


BASE_MODELS_OPTION = typer.Option(  # a list option: one shared default object, not a call per signature
    None,
    help="a base model clients may register (repeat for several; the first is the default): the packaged name, "
    "a Hugging Face id or a folder on this host. Default: the packaged model",
)


def required_join_token() -> str:
    """AGENTRL_JOIN_TOKEN, which a host joining a head presents; a usage error naming it when unset."""
    token = os.environ.get("AGENTRL_JOIN_TOKEN", "")
    if not token:
        raise typer.BadParameter("set AGENTRL_JOIN_TOKEN to the head's join token (the same value on every host)")
    try:
        return check_token_strength(token, "AGENTRL_JOIN_TOKEN")
    except ConfigurationError as error:
        raise typer.BadParameter(str(error)) from error


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
        "",
        help="HOST:PORT on this host where ranks from other hosts join (HOST: the address they reach it at; "
        "default with --remote-ranks: MASTER_ADDR:MASTER_PORT when set)",
    ),
    base_model: list[str] = BASE_MODELS_OPTION,
    server_config: str | None = typer.Option(
        None, help="JSON file of ServerConfig fields (context, parser, extra vLLM flags, ...); clients cannot change it"
    ),
    max_lora_rank: int = typer.Option(64, min=1, help="the largest LoRA rank a client may register"),
    pipelined: bool = typer.Option(
        False,
        help="for clients that train pipelined (train_pipelined, ART's PipelineTrainer) on a CPU server: bound "
        "OpenMP's idle spin (GOMP_SPINCOUNT=2000, unless set) so the trainer and the server share the cores; "
        "synchronous clients train slower with it",
    ),
) -> None:
    """Serve a LocalBackend and its gateway on HOST:PORT for `agentrl.RemoteBackend("http://HOST:PORT")`.

    Its admin token comes from AGENTRL_TOKEN, or is generated once and kept (mode 0600) in
    RUNS/backend.token; it opens every route. Rollouts get a sampling token (AGENTRL_SAMPLING_TOKEN, or
    derived from the admin token) that opens /v1 only. The base models, server settings and LoRA rank
    are the operator's: clients choose within them. Trainer ranks and inference replicas from other hosts
    (agentrl backend rank / replica --join) present AGENTRL_JOIN_TOKEN, set to the same value here and there;
    without it none may join. Ctrl-C stops it."""
    if pipelined and not (bound_openmp_spinning() or spin_is_bounded()):  # before the imports below load torch
        raise typer.BadParameter(
            f"--pipelined: {SPIN_VARIABLE}={os.environ.get(SPIN_VARIABLE)} in the environment lets OpenMP spin on the "
            f"cores the server needs; unset it or set it to {BOUNDED_SPIN_TURNS} (agentrl.foundation.openmp_spin)"
        )
    from agentrl.backend.remote.service import OperatorPolicy, serve_backend
    from agentrl.backend.training.ranks.rank_hosts import launcher_join_address, rank_join_point
    from agentrl.foundation.config import ServerConfig

    try:
        address = rank_join or (launcher_join_address(os.environ) if remote_ranks else "")
        join = rank_join_point(address, remote_ranks, os.environ.get("AGENTRL_JOIN_TOKEN", ""))
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
                join_token=os.environ.get("AGENTRL_JOIN_TOKEN") or None,  # checked by the service
            )
        )
    except KeyboardInterrupt:
        pass
    except ConfigurationError as error:
        raise typer.BadParameter(str(error)) from error


@backend_app.command("rank")
def backend_rank(
    join: str = typer.Option(
        "",
        help="HOST:PORT where the head's backend waits for trainer ranks from other hosts (default: "
        "MASTER_ADDR:MASTER_PORT when a launcher set them, torchrun aside)",
    ),
    model: str | None = typer.Option(None, help="this host's copy of the base model (default: the head's folder)"),
    device: str = typer.Option(
        "",
        help="this rank's device (default: cuda:LOCAL_RANK where this host has a GPU, LOCAL_RANK=0 unless torchrun "
        "set it; else the CPU)",
    ),
    threads: int = typer.Option(
        0, min=0, help="CPU threads for this rank (default: torch's, every core, shared by torchrun's LOCAL_WORLD_SIZE)"
    ),
    wait: float = typer.Option(600.0, min=0, help="seconds to keep trying to reach the head"),
) -> None:
    """Join a head's trainer as one rank from this host, and serve it until the head stops it or goes away.

    The head gives the rank its number, the torch.distributed rendezvous and the trainer's settings; both
    sides hold the same AGENTRL_JOIN_TOKEN. Run it again (or under a supervisor) to rejoin after a restart. For
    one rank per GPU of a host: `torchrun --nproc-per-node G -m agentrl.cli backend rank --join HOST:PORT`."""
    import logging

    import torch

    from agentrl.backend.training.ranks.rank_hosts import launcher_join_address
    from agentrl.backend.training.ranks.rank_joiner import join_as_rank
    from agentrl.foundation.errors import TrainingError

    token = required_join_token()
    join = join or launcher_join_address(os.environ)
    if not join:
        raise typer.BadParameter(
            "pass --join HOST:PORT, the head's --rank-join (or set MASTER_ADDR and MASTER_PORT to it; under torchrun "
            "those are torchrun's own, so pass --join)"
        )
    sharing = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))  # torchrun's processes on this host
    if threads or sharing > 1:
        torch.set_num_threads(threads or max(1, len(os.sched_getaffinity(0)) // sharing))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        rank = join_as_rank(join, token, model_path=model, device=device or None, wait_s=wait)
    except ConfigurationError as error:
        raise typer.BadParameter(str(error)) from error
    except TrainingError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from error
    typer.echo(f"trainer rank {rank} done: the head at {join} stopped it or went away")


@backend_app.command("replica")
def backend_replica(
    join: str = typer.Option(..., help="HOST:PORT (or http://HOST:PORT) of the head's gateway"),
    model: str | None = typer.Option(None, help="this host's copy of the base model (default: the head's folder)"),
    host: str = typer.Option("", help="the address the head reaches this host at (default: the one toward the head)"),
    port: int = typer.Option(0, min=0, help="port of this replica's agent (default: a free one)"),
    folder: str = typer.Option("agentrl-replica", help="where its vLLM log and the adapters pushed to it are kept"),
    wait: float = typer.Option(600.0, min=0, help="seconds to keep trying to reach the head at the start"),
) -> None:
    """Serve the head's model from this host: a vLLM server here, in the head gateway's rotation.

    The head pushes every adapter it serves over HTTP (checked by SHA-256) before sending this replica a
    request; both sides hold the same AGENTRL_JOIN_TOKEN. When the head stops or restarts, the replica
    offers itself again. Runs until its server dies or Ctrl-C."""
    import logging

    from agentrl.backend.serving.replica_agent import serve_replica
    from agentrl.foundation.errors import ServerError

    token = required_join_token()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(
            serve_replica(join, token, folder=Path(folder), model=model, host=host or None, port=port, wait_s=wait)
        )
    except KeyboardInterrupt:
        pass
    except ConfigurationError as error:
        raise typer.BadParameter(str(error)) from error
    except ServerError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from error
