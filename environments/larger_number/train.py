"""README's main job: train the packaged model on the larger-number task and compare held-out reward.

python -m environments.larger_number.train [--steps 20]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import agentrl
from environments.larger_number.task import evaluate, rollout, scenarios


async def main(
    steps: int, groups_per_step: int, group_size: int, learning_rate: float, name: str, base_path: str
) -> None:
    model = agentrl.TrainableModel(name=name, project="larger-number", base_path=base_path)
    backend = agentrl.LocalBackend()
    try:
        print(f"Starting the vLLM server and trainer for {model.base_model} ...")
        await model.register(backend)
        test = scenarios("test", 128)
        start_step = await model.get_step()
        reward_before = await evaluate(model, test)
        print(f"held-out reward at step {start_step}: {reward_before:.3f}")
        train = scenarios("train", steps * groups_per_step, seed=1)
        config = agentrl.TrainConfig(learning_rate=learning_rate)
        for step in range(start_step, start_step + steps):
            started = time.perf_counter()
            batch = train[(step - start_step) * groups_per_step : (step - start_step + 1) * groups_per_step]
            groups = await agentrl.gather_trajectory_groups(
                (agentrl.TrajectoryGroup(rollout(model, s) for _ in range(group_size)) for s in batch),
                desc=f"step {step + 1} rollouts",
            )
            result = await model.train(groups, config)
            m = result.metrics
            print(
                f"step {result.step}: reward {m['reward_mean']:.3f} ± {m['reward_std']:.3f}, "
                f"zero-variance groups {m['frac_zero_variance_groups']:.0%}, trained tokens {m.get('trained_tokens', 0):.0f}, "
                f"kl(sampler||trainer) {m.get('kl_sampler_trainer', 0):.4f}, {time.perf_counter() - started:.1f} s"
                + (" (skipped: no signal)" if result.skipped else "")
            )
        reward_after = await evaluate(model, test)
        print(
            f"\nheld-out reward: step {start_step} {reward_before:.3f} -> step {await model.get_step()} {reward_after:.3f}"
        )
        print(f"run folder: {model.run_dir.resolve()}")
    finally:
        await backend.close()


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--groups-per-step", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--learning-rate", type=float, default=5e-4)
    parser.add_argument("--name", default="main-job")
    parser.add_argument("--base-path", default=".agentrl")
    args = parser.parse_args()
    asyncio.run(main(args.steps, args.groups_per_step, args.group_size, args.learning_rate, args.name, args.base_path))


if __name__ == "__main__":
    cli()
