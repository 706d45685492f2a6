"""Train an agent to play 2048.

.venv/bin/agentrl train 2048 [--preset cpu|gpu] [--steps N] [--model ...]
"""

from __future__ import annotations

import agentrl

from ..training import (
    RunSummary,
    evaluate_base_and_checkpoint,
    train_and_evaluate,
    with_overrides,
)
from .env import PRESETS, Scenario, evaluate, rollout, scenarios


async def run(
    preset_name: str = "cpu",
    steps: int | None = None,
    base_model: str | None = None,
    name: str = "2048-agent",
    base_path: str = agentrl.DEFAULT_BASE_PATH,
    test_games: int = 24,
    max_steps_off_policy: int | None = None,
) -> RunSummary:
    preset = with_overrides(PRESETS[preset_name], steps, base_model)
    model = agentrl.TrainableModel(name=name, project="2048", base_model=preset.base_model, base_path=base_path)
    train = scenarios("train", preset.steps * preset.groups_per_step, preset)
    test = scenarios("test", test_games, preset)

    def make_group(model: agentrl.TrainableModel, game: Scenario) -> agentrl.TrajectoryGroup:
        # Every member of a group plays the same seeded game, so rewards differ only by the moves chosen.
        return agentrl.TrajectoryGroup(
            rollout(model, game, max_tokens=preset.max_tokens) for _ in range(preset.group_size)
        )

    return await train_and_evaluate(
        model,
        scenarios=train,
        groups_per_step=preset.groups_per_step,
        make_group=make_group,
        evaluate=lambda m: evaluate(m, test, max_tokens=preset.max_tokens),
        steps=preset.steps,
        config=agentrl.TrainConfig(learning_rate=preset.learning_rate),
        max_steps_off_policy=max_steps_off_policy,
    )


async def evaluate_run(
    preset_name: str = "cpu", name: str = "2048-agent", base_path: str = agentrl.DEFAULT_BASE_PATH, test_games: int = 24
) -> dict[str, dict[str, float]]:
    """Held-out metrics of the prompted base model and of the run's latest checkpoint."""
    preset = PRESETS[preset_name]
    model = agentrl.TrainableModel(name=name, project="2048", base_model=preset.base_model, base_path=base_path)
    test = scenarios("test", test_games, preset)
    return await evaluate_base_and_checkpoint(model, lambda m: evaluate(m, test, max_tokens=preset.max_tokens))


COMMANDS = agentrl.EnvironmentCommands(run=run, evaluate_run=evaluate_run, default_name="2048-agent", rewards=())
"""What `agentrl train|eval` finds through this package's "agentrl.environments" entry point."""
