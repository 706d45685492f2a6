"""Environments plug into the `agentrl` command through the "agentrl.environments" entry points.

The library never imports a recipe: an environment package declares, in its pyproject.toml,

    [project.entry-points."agentrl.environments"]
    my-game = "my_package.train:COMMANDS"

where COMMANDS is an `EnvironmentCommands`. `agentrl train 2048` finds it by that name; any
installed package can add environments the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from agentrl.foundation.errors import ConfigurationError

ENTRY_POINT_GROUP = "agentrl.environments"


@dataclass(frozen=True)
class EnvironmentCommands:
    """How the `agentrl` command trains and evaluates one environment."""

    run: Callable[..., Coroutine[Any, Any, Any]]
    """`run(preset, steps, base_model, name=..., base_path=..., [reward=..., judge=..., judge_readout=...])`: train, evaluating before and after."""
    evaluate_run: Callable[..., Coroutine[Any, Any, Any]]
    """`evaluate_run(preset, name=..., base_path=...)`: held-out metrics of the base model and of a run's checkpoint."""
    default_name: str
    """The run name when none is given."""
    rewards: tuple[str, ...] = ()
    """Training rewards to choose from (`run(..., reward=, judge=)`), the default first; () = the environment's own only."""
    judged_rewards: tuple[str, ...] = ()
    """The rewards among `rewards` that an LLM judge gives (where `--judge` and `--judge-readout` apply)."""
    takes_tasks: bool = False
    """Whether `run(..., tasks=FILE)` trains on a user's task file (`agentrl train ENV --tasks FILE`)."""


def environment_names() -> list[str]:
    """The installed environments' names (read from package metadata; nothing is imported)."""
    return sorted({ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})


def load_environment(name: str) -> EnvironmentCommands:
    """The commands of environment `name`; `ConfigurationError` naming the installed ones if there is none."""
    found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    if not found:
        installed = ", ".join(environment_names()) or "none (is the package installed? pip install -e .)"
        raise ConfigurationError(f"unknown environment {name!r}; choose one of: {installed}")
    commands = found[0].load()
    if not isinstance(commands, EnvironmentCommands):
        raise ConfigurationError(f"entry point {found[0].value} for {name!r} is not an agentrl EnvironmentCommands")
    return commands
