"""A client process for test_remote_backend: trains a model on a remote backend, printing its progress.

python tests/remote_client.py URL NAME STEPS  (the token comes from AGENTRL_TOKEN)
"""

from __future__ import annotations

import asyncio
import sys

import agentrl


async def sampled_answer(model: agentrl.TrainableModel, reward: float) -> agentrl.Trajectory:
    """A short answer sampled through the service's gateway, rewarded `reward`."""
    messages = [{"role": "user", "content": "Name a colour."}]
    completion = await model.openai_client().chat.completions.create(
        model=model.inference_name, messages=messages, max_tokens=8, temperature=1.0
    )
    return agentrl.Trajectory(messages_and_choices=[*messages, completion.choices[0]], reward=reward)


async def sampled_group(model: agentrl.TrainableModel) -> agentrl.TrajectoryGroup:
    """Two short answers rewarded 0 and 1 (a signal to train on)."""
    return agentrl.TrajectoryGroup([await sampled_answer(model, reward) for reward in (0.0, 1.0)])


async def main(url: str, name: str, steps: int) -> None:
    model = agentrl.TrainableModel(name=name, project="remote")
    backend = agentrl.RemoteBackend(url)
    await model.register(backend)
    print("REGISTERED", model.inference_name, flush=True)
    for _ in range(steps):
        groups = [await sampled_group(model) for _ in range(2)]
        print("TRAINING", flush=True)
        result = await model.train(groups, agentrl.TrainConfig(learning_rate=1e-3))
        print("STEP", result.step, model.inference_name, flush=True)
    await backend.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
