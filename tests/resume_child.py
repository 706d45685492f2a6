"""Run by test_resume.py in its own process: register (two sharded trainer ranks), train one pipelined step
on batches from `iterate_dataset` (the next step's groups already sampling, some perhaps taken by this one),
report, then wait to be killed.

Metrics go to an offline W&B run (the test sets WANDB_MODE=offline), to check that the resumed run appends to it."""

import asyncio
import hashlib
import sys

import agentrl
from agentrl_environments.larger_number.task import rollout, scenarios


async def main(base_path: str) -> None:
    model = agentrl.TrainableModel(name="resumable", project="tests", base_path=base_path, wandb=True)
    await model.register(agentrl.LocalBackend(trainer_ranks=2, shard_trainer=True))
    train = scenarios("train", 8, seed=5)
    batches = list(agentrl.iterate_dataset(train, batch_size=4, already_trained=model.trained_scenarios()))

    def make_groups(model: agentrl.TrainableModel, step: int) -> list[agentrl.TrajectoryGroup]:
        return batches[step].groups(lambda s: agentrl.TrajectoryGroup(rollout(model, s) for _ in range(8)))

    async def report_then_wait(result: agentrl.TrainResult) -> None:
        assert not result.skipped, "no signal in 4 groups of 8; rerun"
        adapter = model.run_dir / "checkpoints" / f"{result.step:04d}" / "adapter_model.safetensors"
        server_pgid = model._backend.server.replicas[0].process.pid
        rank_pids = ",".join(map(str, model._backend.trainer.pids))
        digest = hashlib.sha256(adapter.read_bytes()).hexdigest()
        print(f"CHECKPOINTED {result.step} {digest} {server_pgid} {rank_pids}", flush=True)
        await asyncio.sleep(3600)  # the test kills us here, with the next step's rollouts in flight

    # Pipelined: the next step's groups are sampling when the kill comes; none of them may train later.
    await agentrl.train_pipelined(
        model,
        make_groups,
        steps=2,
        max_steps_off_policy=1,
        config=agentrl.TrainConfig(learning_rate=1e-3, truncated_importance_sampling=2.0),
        on_step=report_then_wait,
    )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
