"""A step that fails part-way changes nothing (`agentrl.backend.session`: the update, the save and the
switch roll back to the served checkpoint) and the next step applies exactly one update; judge failures
on some groups train the rest and are reported. The session's real model and server."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch

import agentrl
from agentrl.backend.processes import free_port
from agentrl.records.checkpoints import CheckpointStore
from tests.helpers import alternating_reward_groups

NAN = math.nan


def adapter_state(model: agentrl.TrainableModel) -> dict[str, torch.Tensor]:
    from peft import get_peft_model_state_dict

    adapter = model.backend.session(model).adapter
    weights = get_peft_model_state_dict(model.backend.trainer.model, adapter_name=adapter)
    return {k: v.detach().clone() for k, v in weights.items()}


def optimizer_state(model: agentrl.TrainableModel) -> dict:
    """AdamW's moments and step counts (lr and weight decay are set from the config at every step)."""
    return copy.deepcopy(optimizer(model).state_dict()["state"])


def optimizer(model: agentrl.TrainableModel) -> torch.optim.Optimizer:
    return model.backend.trainer.adapters[model.backend.session(model).adapter].optimizer


def assert_same_state(before: dict, after: dict) -> None:
    assert before.keys() == after.keys()
    for key in before:
        if isinstance(before[key], torch.Tensor):
            assert torch.equal(before[key], after[key]), key
        elif isinstance(before[key], dict):
            assert_same_state(before[key], after[key])
        else:
            assert before[key] == after[key], key


@pytest.fixture
async def real_groups(served_model) -> list[agentrl.TrajectoryGroup]:
    return await alternating_reward_groups(served_model)


def poisoned(groups: list[agentrl.TrajectoryGroup]) -> list[agentrl.TrajectoryGroup]:
    """The same groups with one sampled logprob NaN, as a broken sampler might return it."""
    groups = [g.model_copy(deep=True) for g in groups]
    groups[0].trajectories[0].choices()[0].logprobs.content[0].logprob = NAN
    return groups


async def test_a_non_finite_step_changes_nothing_and_the_next_step_trains(served_model, real_groups):
    step = await served_model.get_step()
    weights, moments = adapter_state(served_model), optimizer_state(served_model)
    checkpoints = CheckpointStore(served_model.run_dir).steps()
    with pytest.raises(agentrl.TrainingError, match="loss is nan.*nothing was applied or saved"):
        await served_model.train(poisoned(real_groups), agentrl.TrainConfig(learning_rate=1e-3))
    assert await served_model.get_step() == step and CheckpointStore(served_model.run_dir).steps() == checkpoints
    assert_same_state(weights, adapter_state(served_model))
    assert_same_state(moments, optimizer_state(served_model))
    result = await served_model.train(real_groups, agentrl.TrainConfig(learning_rate=1e-3))
    assert result.step == step + 1 and not result.skipped and math.isfinite(result.metrics["grad_norm"])
    assert all(torch.isfinite(v).all() for v in adapter_state(served_model).values())


def full_disk_during_save(trainer_save):
    def save(adapter: str, folder: Path) -> None:
        trainer_save(adapter, folder)  # the files land, then the disk fills up on the last one
        raise OSError(28, "No space left on device")

    return save


async def test_a_failed_save_rolls_the_trainer_back_so_a_retry_applies_one_step(served_model, real_groups, monkeypatch):
    backend = served_model.backend
    step = await served_model.get_step()
    weights, moments = adapter_state(served_model), optimizer_state(served_model)
    monkeypatch.setattr(backend.trainer, "save", full_disk_during_save(backend.trainer.save))
    with pytest.raises(agentrl.CheckpointError, match="No space left on device.*rolled back"):
        await served_model.train(real_groups, agentrl.TrainConfig(learning_rate=1e-3))
    monkeypatch.undo()
    store = backend.session(served_model).store
    assert await served_model.get_step() == step and not list(store.root.glob(".staging-*"))
    assert_same_state(weights, adapter_state(served_model))
    assert_same_state(moments, optimizer_state(served_model))
    adam_steps = {float(s["step"]) for s in optimizer(served_model).state.values()}
    result = await served_model.train(real_groups, agentrl.TrainConfig(learning_rate=1e-3))
    assert result.step == step + 1  # exactly one step, not two
    assert {float(s["step"]) for s in optimizer(served_model).state.values()} == {s + 1 for s in adam_steps}


async def test_a_failed_switch_rolls_back_and_keeps_serving_the_old_adapter(served_model, real_groups, monkeypatch):
    backend = served_model.backend
    step = await served_model.get_step()
    weights = adapter_state(served_model)

    async def server_refuses(name: str, path: Path) -> None:
        raise agentrl.ServerError("POST /v1/load_lora_adapter failed with 500: stand-in for a dying server")

    monkeypatch.setattr(backend.server, "load_adapter", server_refuses)
    with pytest.raises(agentrl.ServerError, match="rolled back.*moved aside"):
        await served_model.train(real_groups, agentrl.TrainConfig(learning_rate=1e-3))
    monkeypatch.undo()
    store = backend.session(served_model).store
    assert await served_model.get_step() == step and store.steps()[-1] == step
    (aside,) = [p for p in store.root.glob(f".corrupt-{step + 1:04d}-*")]  # kept, not deleted
    assert "could not load checkpoint" in (aside / "WHY.txt").read_text()
    assert_same_state(weights, adapter_state(served_model))
    completion = await served_model.openai_client().chat.completions.create(
        model=served_model.inference_name, messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    assert completion.choices[0].message.content is not None
    assert (await served_model.train(real_groups, agentrl.TrainConfig(learning_rate=1e-3))).step == step + 1


async def test_judge_failures_on_30_percent_of_groups_train_and_are_reported(served_model, real_groups):
    dead_judge = agentrl.Model(name="judge", base_url=f"http://127.0.0.1:{free_port()}/v1", api_key="k")
    judged = [
        await agentrl.ruler_score_group(g, dead_judge, swallow_exceptions=True, max_attempts=1) for g in real_groups[:2]
    ]
    groups = [*judged, *real_groups, *real_groups[:1]]  # 2 of 7 groups (29%) lost to the judge
    step = await served_model.get_step()
    result = await served_model.train(groups, agentrl.TrainConfig(learning_rate=1e-3))
    assert result.step == step + 1 and not result.skipped
    assert result.metrics["num_groups_judge_failed"] == 2 and result.metrics["num_groups_given"] == 7
    assert "judge openai/judge gave no valid answer" in result.last_judge_error
    with pytest.raises(agentrl.JudgeError, match="dropped 2 of 3 groups"):  # over half: stop
        await served_model.train([*judged, real_groups[0]], agentrl.TrainConfig())
