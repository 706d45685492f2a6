"""Train an agent to play 2048.

python -m agentrl_environments.twenty_forty_eight.train [--preset cpu|gpu] [--steps N] [--model ...]
agentrl train 2048 [--preset cpu|gpu] [--steps N]
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Iterator

import agentrl
from agentrl.stop_signals import handle_stop_signals

from ..training import (
    RunSummary,
    evaluate_base_and_checkpoint,
    step_batch,
    train_and_evaluate,
    with_overrides,
)
from .env import PRESETS, evaluate, rollout, scenarios


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

    def make_groups(model: agentrl.TrainableModel, step: int) -> Iterator[agentrl.TrajectoryGroup]:
        batch = step_batch(train, step, preset.groups_per_step)
        # Every member of a group plays the same seeded game, so rewards differ only by the moves chosen.
        return (
            agentrl.TrajectoryGroup(rollout(model, s, max_tokens=preset.max_tokens) for _ in range(preset.group_size))
            for s in batch
        )

    return await train_and_evaluate(
        model,
        make_groups=make_groups,
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--model", default=None, help="base model (default: the preset's)")
    parser.add_argument("--base-path", default=agentrl.DEFAULT_BASE_PATH)
    args = parser.parse_args()
    handle_stop_signals()
    asyncio.run(run(args.preset, args.steps, args.model, base_path=args.base_path))


if __name__ == "__main__":
    main()
