"""The `agentrl` command: train and evaluate the shipped environments.

agentrl train 2048 [--preset cpu|gpu] [--steps N] [--model ...]
agentrl eval 2048 [--name RUN] [--preset cpu|gpu]
"""

from __future__ import annotations

import asyncio
import importlib
from dataclasses import dataclass

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Train LLM agents with reinforcement learning.")


@dataclass(frozen=True)
class EnvironmentEntry:
    """Where an environment's training and evaluation live."""

    module: str  # has `run(preset, steps, base_model, name=..., base_path=...)` and `evaluate_run(...)`
    default_name: str


ENVIRONMENTS = {
    "2048": EnvironmentEntry("environments.twenty_forty_eight.train", "2048-agent"),
    "email": EnvironmentEntry("environments.email_agent.train", "email-agent"),
    "larger-number": EnvironmentEntry("environments.larger_number.train", "main-job"),
}


def _entry(env: str) -> EnvironmentEntry:
    if env not in ENVIRONMENTS:
        raise typer.BadParameter(f"unknown environment {env!r}; choose one of: {', '.join(sorted(ENVIRONMENTS))}")
    return ENVIRONMENTS[env]


@app.command()
def train(
    env: str = typer.Argument(..., help=f"one of: {', '.join(sorted(ENVIRONMENTS))}"),
    preset: str = typer.Option("cpu", help="cpu (this laptop-class machine) or gpu"),
    steps: int | None = typer.Option(None, help="training steps (default: the preset's)"),
    model: str | None = typer.Option(None, help="base model: the packaged default, a Hugging Face id or a folder"),
    name: str | None = typer.Option(None, help="run name (default: the environment's); an existing run resumes"),
    base_path: str = typer.Option(".agentrl", help="root folder of runs"),
) -> None:
    """Train an agent on an environment, printing held-out metrics before and after."""
    entry = _entry(env)
    module = importlib.import_module(entry.module)
    asyncio.run(module.run(preset, steps, model, name=name or entry.default_name, base_path=base_path))


@app.command("eval")
def evaluate(
    env: str = typer.Argument(..., help=f"one of: {', '.join(sorted(ENVIRONMENTS))}"),
    preset: str = typer.Option("cpu", help="cpu or gpu"),
    name: str | None = typer.Option(None, help="run to evaluate at its latest checkpoint (default: the environment's)"),
    base_path: str = typer.Option(".agentrl", help="root folder of runs"),
) -> None:
    """Held-out metrics of the prompted base model and of a run's latest checkpoint."""
    entry = _entry(env)
    module = importlib.import_module(entry.module)
    asyncio.run(module.evaluate_run(preset, name=name or entry.default_name, base_path=base_path))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
