"""The `agentrl` Typer app, its global options, the helpers its command groups share, and `main`."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from agentrl.foundation.errors import ConfigurationError
from agentrl.foundation.stop_signals import handle_stop_signals
from agentrl.records.checkpoints import CheckpointStore
from agentrl.records.runs import RunInfo, resolve_run

if TYPE_CHECKING:
    from agentrl.backend.serving.server import VLLMServer

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Train LLM agents with reinforcement learning.")


def _print_version(value: bool) -> None:
    if value:
        from agentrl import __version__

        typer.echo(f"agentrl {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True, help="print the version"),
) -> None:
    """Train LLM agents with reinforcement learning."""


def _show_library_messages() -> None:
    """agentrl's INFO messages (where the server and run folder are, what each step did) on stderr."""
    logger = logging.getLogger("agentrl")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


def resolve_run_option(run: str, base_path: str) -> RunInfo:
    """The run PROJECT/NAME (or a folder) names; a usage error naming the runs there if there is none."""
    try:
        return resolve_run(run, base_path)
    except ConfigurationError as error:
        raise typer.BadParameter(str(error)) from error


def fmt(value: float | None) -> str:
    """A metric for a table: three decimals, or "-" where none was recorded."""
    return "-" if value is None else f"{value:.3f}"


def base_model_server(info: RunInfo, step: int, log_path: Path) -> VLLMServer:
    """A (not yet started) vLLM server of the base model that checkpoint `step` was trained on, able to load it."""
    from agentrl.backend.serving.server import VLLMServer
    from agentrl.foundation.config import ServerConfig

    adapter = CheckpointStore(info.path).adapter_config(step)
    return VLLMServer(adapter["base_model_name_or_path"], log_path, ServerConfig(), max_lora_rank=int(adapter["r"]))


def main() -> None:
    from agentrl.backend.extras import BackendNotInstalledError, missing_backend_extra

    handle_stop_signals()
    _show_library_messages()
    try:
        with missing_backend_extra(" ".join(["agentrl", *sys.argv[1:2]])):
            app(prog_name="agentrl")
    except BackendNotInstalledError as error:
        typer.echo(f"error: {error}", err=True)
        raise SystemExit(1) from None
