"""README's main job: train the packaged model on the larger-number task and compare held-out reward.

python -m agentrl_environments.larger_number.train [--steps 20]
agentrl train larger-number
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Iterator

import agentrl
from agentrl.stop_signals import handle_stop_signals

from ..training import RunSummary, evaluate_base_and_checkpoint, step_batch, train_and_evaluate
from .task import evaluate, rollout, scenarios

GROUPS_PER_STEP, GROUP_SIZE, LEARNING_RATE, DEFAULT_STEPS = 8, 8, 5e-4, 20
TEST = scenarios("test", 128)


async def held_out(model: agentrl.Model) -> list[agentrl.Trajectory]:
    return await evaluate(model, TEST)


async def run(
    preset: str = "cpu",
    steps: int | None = None,
    base_model: str | None = None,
    name: str = "main-job",
    base_path: str = agentrl.DEFAULT_BASE_PATH,
    max_steps_off_policy: int | None = None,
) -> RunSummary:
    """Train on the larger-number task (one preset: it is small enough for any machine)."""
    steps = steps if steps is not None else DEFAULT_STEPS
    model = agentrl.TrainableModel(
        name=name, project="larger-number", base_path=base_path, **({"base_model": base_model} if base_model else {})
    )
    train = scenarios("train", steps * GROUPS_PER_STEP, seed=1)

    def make_groups(model: agentrl.TrainableModel, step: int) -> Iterator[agentrl.TrajectoryGroup]:
        batch = step_batch(train, step, GROUPS_PER_STEP)
        return (agentrl.TrajectoryGroup(rollout(model, s) for _ in range(GROUP_SIZE)) for s in batch)

    return await train_and_evaluate(
        model,
        make_groups=make_groups,
        evaluate=held_out,
        steps=steps,
        config=agentrl.TrainConfig(learning_rate=LEARNING_RATE),
        max_steps_off_policy=max_steps_off_policy,
    )


async def evaluate_run(
    preset: str = "cpu", name: str = "main-job", base_path: str = agentrl.DEFAULT_BASE_PATH
) -> dict[str, dict[str, float]]:
    model = agentrl.TrainableModel(name=name, project="larger-number", base_path=base_path)
    return await evaluate_base_and_checkpoint(model, held_out)


COMMANDS = agentrl.EnvironmentCommands(run=run, evaluate_run=evaluate_run, default_name="main-job", rewards=())
"""What `agentrl train|eval` finds through this package's "agentrl.environments" entry point."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    parser.add_argument("--name", default="main-job")
    parser.add_argument("--base-path", default=agentrl.DEFAULT_BASE_PATH)
    parser.add_argument(
        "--max-steps-off-policy",
        type=int,
        default=None,
        help="train pipelined: rollouts sample up to this many steps ahead of the trainer (default: synchronous)",
    )
    args = parser.parse_args()
    handle_stop_signals()
    asyncio.run(
        run(
            steps=args.steps,
            name=args.name,
            base_path=args.base_path,
            max_steps_off_policy=args.max_steps_off_policy,
        )
    )


if __name__ == "__main__":
    main()
