"""`agentrl train` and `agentrl eval`: the installed environments' commands (entry points)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import typer

from agentrl.cli.app import app
from agentrl.foundation.errors import ConfigurationError
from agentrl.foundation.openmp_spin import bound_openmp_spinning
from agentrl.foundation.plugins import EnvironmentCommands, environment_names, load_environment
from agentrl.records.run_folder import DEFAULT_BASE_PATH


def _entry(env: str) -> EnvironmentCommands:
    try:
        return load_environment(env)
    except ConfigurationError as error:
        raise typer.BadParameter(str(error)) from error


@app.command()
def train(
    env: str = typer.Argument(..., help=f"one of: {', '.join(environment_names())}"),
    preset: str = typer.Option("cpu", help="cpu (this laptop-class machine) or gpu"),
    steps: int | None = typer.Option(
        None, help="the run's training steps in all: a resumed run trains the rest (default: the preset's)"
    ),
    model: str | None = typer.Option(None, help="base model: the packaged default, a Hugging Face id or a folder"),
    name: str | None = typer.Option(None, help="run name (default: the environment's); an existing run resumes"),
    base_path: str = typer.Option(DEFAULT_BASE_PATH, help="root folder of runs"),
    reward: str | None = typer.Option(
        None,
        help="training reward, where the environment offers a choice (email: match, judge or ruler; "
        "rubric: rubric, ruler or ruler-generic)",
    ),
    judge: str | None = typer.Option(
        None,
        help="litellm model id for a judged reward, or run:NAME for a judge trained with `agentrl judge train` "
        "(default: the base model, served locally)",
    ),
    judge_readout: str | None = typer.Option(
        None,
        help="how RULER rewards read the judge: probabilities (the default: one token per pair of attempts, both "
        "orders, where the judge returns logprobs, else JSON) or json (sampled scores and explanations)",
    ),
    tasks: str | None = typer.Option(None, help="your task file, where the environment takes one (rubric: JSONL)"),
    weave: str | None = typer.Option(None, help="trace every rollout into this Weave project (entity/project)"),
    max_steps_off_policy: int | None = typer.Option(
        None, help="train pipelined: rollouts sample up to this many steps ahead of the trainer (default: synchronous)"
    ),
) -> None:
    """Train an agent on an environment, printing held-out metrics before and after.

    Metrics also go to W&B when WANDB_API_KEY is set (WANDB_MODE=offline works without a network)."""
    entry = _entry(env)
    choice = _judging(env, entry, reward, judge, judge_readout)
    if tasks is not None:
        if not entry.takes_tasks:
            taking = ", ".join(e for e in environment_names() if load_environment(e).takes_tasks)
            raise typer.BadParameter(f"environment {env!r} has its own tasks; --tasks applies to: {taking}")
        if not Path(tasks).is_file():
            raise typer.BadParameter(f"no task file at {tasks}")
        choice["tasks"] = tasks
    if weave is not None:
        from agentrl.client.weave_tracing import enable_weave

        enable_weave(weave)
    choice.update(_pipelining(max_steps_off_policy))
    asyncio.run(entry.run(preset, steps, model, name=name or entry.default_name, base_path=base_path, **choice))


def _judging(
    env: str, entry: EnvironmentCommands, reward: str | None, judge: str | None, judge_readout: str | None
) -> dict[str, Any]:
    """The run's reward, judge and judge readout as `run(...)` takes them; BadParameter where the environment
    does not offer what was asked."""
    choice: dict[str, Any] = {}
    if reward is not None or judge is not None:
        offering = ", ".join(e for e in environment_names() if load_environment(e).rewards)
        if not entry.rewards:
            raise typer.BadParameter(
                f"environment {env!r} has its own reward only; --reward/--judge apply to: {offering}"
            )
        if reward is not None and reward not in entry.rewards:
            raise typer.BadParameter(
                f"unknown reward {reward!r} for {env!r}; choose one of: {', '.join(entry.rewards)}"
            )
        if judge is not None and (reward or entry.rewards[0]) not in entry.judged_rewards:
            raise typer.BadParameter(f"--judge needs {' or '.join(f'--reward {r}' for r in entry.judged_rewards)}")
        choice = {"reward": reward, "judge": judge}
    if judge_readout is not None:
        from agentrl.judges.readout import READOUTS

        if judge_readout not in READOUTS:
            raise typer.BadParameter(f"--judge-readout must be one of: {', '.join(READOUTS)}")
        if not entry.judged_rewards:
            judged = ", ".join(e for e in environment_names() if load_environment(e).judged_rewards)
            raise typer.BadParameter(f"environment {env!r} has no judged reward; --judge-readout applies to: {judged}")
        choice["judge_readout"] = judge_readout
    return choice


def _pipelining(max_steps_off_policy: int | None) -> dict[str, Any]:
    """The run's pipelining choice. A pipelined run's server samples while its trainer steps, so OpenMP's spin is
    bounded first, before torch loads (agentrl.foundation.openmp_spin)."""
    if max_steps_off_policy is None:
        return {}
    if max_steps_off_policy > 0:
        bound_openmp_spinning()
    return {"max_steps_off_policy": max_steps_off_policy}


@app.command("eval")
def evaluate(
    env: str = typer.Argument(..., help=f"one of: {', '.join(environment_names())}"),
    preset: str = typer.Option("cpu", help="cpu or gpu"),
    name: str | None = typer.Option(None, help="run to evaluate at its latest checkpoint (default: the environment's)"),
    base_path: str = typer.Option(DEFAULT_BASE_PATH, help="root folder of runs"),
) -> None:
    """Held-out metrics of the prompted base model and of a run's latest checkpoint."""
    entry = _entry(env)
    asyncio.run(entry.evaluate_run(preset, name=name or entry.default_name, base_path=base_path))
