"""Run by test_resume.py in its own process: register, train one step, report, then wait to be killed.

Metrics go to an offline W&B run (the test sets WANDB_MODE=offline), to check that the resumed run appends to it."""

import asyncio
import hashlib
import sys

import agentrl
from environments.larger_number.task import rollout, scenarios


async def main(base_path: str) -> None:
    model = agentrl.TrainableModel(name="resumable", project="tests", base_path=base_path, wandb=True)
    await model.register(agentrl.LocalBackend())
    groups = await agentrl.gather_trajectory_groups(
        [agentrl.TrajectoryGroup(rollout(model, s) for _ in range(8)) for s in scenarios("train", 4, seed=5)],
        show_progress=False,
    )
    result = await model.train(groups, agentrl.TrainConfig(learning_rate=1e-3))
    assert not result.skipped, "no signal in 4 groups of 8; rerun"
    adapter = model.run_dir / "checkpoints" / f"{result.step:04d}" / "adapter_model.safetensors"
    server_pgid = model._backend.server.process.pid
    print(f"CHECKPOINTED {result.step} {hashlib.sha256(adapter.read_bytes()).hexdigest()} {server_pgid}", flush=True)
    await asyncio.sleep(3600)  # the test kills us here, mid-run


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
