"""`agentrl backend serve`: a LocalBackend and its gateway as a service for `RemoteBackend`."""

from __future__ import annotations

import asyncio
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
    are the operator's: clients choose within them. Ctrl-C stops it."""
    from agentrl.backend.remote.service import OperatorPolicy, serve_backend
    from agentrl.config import ServerConfig

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
            )
        )
    except KeyboardInterrupt:
        pass
    except ConfigurationError as error:
        raise typer.BadParameter(str(error)) from error
