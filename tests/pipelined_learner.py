"""Run by test_closed_loop.py in its own process, with OpenMP's spin bounded as a pipelined CPU run must be
(agentrl.foundation.openmp_spin): a fresh adapter on its own LocalBackend trains `steps` steps with `train_pipelined`
(rollouts one step ahead of the trainer, the default loss) and prints, as one JSON line, the held-out reward
before and after and what each step trained on, for the test to judge."""

import asyncio
import json
import sys

import agentrl
from agentrl.records.step_metrics import summarize
from agentrl.records.tracking import load_trajectories
from agentrl_environments.larger_number.task import evaluate, rollout, scenarios


async def main(base_path: str, steps: int, learning_rate: float) -> None:
    model = agentrl.TrainableModel(name="learner", project="tests", base_path=base_path)
    backend = agentrl.LocalBackend()
    await model.register(backend)
    try:
        test = scenarios("test", 64)
        before = summarize(await evaluate(model, test, samples=2))["reward_mean"]
        train = scenarios("train", steps * 8, seed=7)

        def make_groups(model: agentrl.TrainableModel, step: int) -> list[agentrl.TrajectoryGroup]:
            return [
                agentrl.TrajectoryGroup(rollout(model, s) for _ in range(8)) for s in train[step * 8 : step * 8 + 8]
            ]

        results = await agentrl.train_pipelined(
            model,
            make_groups,
            steps=steps,
            max_steps_off_policy=1,
            config=agentrl.TrainConfig(learning_rate=learning_rate),
        )
        trained = []
        for result in results:
            groups = load_trajectories(model.run_dir / "trajectories" / f"train-{result.step:04d}.jsonl")
            policy_steps = [c.model_extra["policy_step"] for g in groups for t in g.trajectories for c in t.choices()]
            trained.append({"step": result.step, "metrics": result.metrics, "policy_steps": policy_steps})
        after = summarize(await evaluate(model, test, samples=2))["reward_mean"]
        print(json.dumps({"before": before, "after": after, "n": len(test) * 2, "steps": trained}), flush=True)
    finally:
        await backend.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3])))
