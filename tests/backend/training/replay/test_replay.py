"""A trained step records its input in its checkpoint, and `agentrl replay` trains it again from the
checkpoint before: the same adapter and optimizer bytes under the same conditions, and where the bytes
differ, the largest difference. The real trainer and step transaction on the tiny model (the fast tier)
and on the packaged model behind the real server (slow)."""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import re

import pytest
import torch

import agentrl
from agentrl.backend.training.replay.replay import replay_step
from agentrl.backend.training.step_input import read_step_input
from agentrl.backend.training.trainer import Trainer
from agentrl.cli import app
from agentrl.records.checkpoints import STEP_INPUT_FILE
from tests.helpers import AdapterSlots, flat, model_on_a_server_seam, runner, synthetic_groups


def trainable_on_tiny_model(tiny_model_path, tmp_path) -> agentrl.TrainableModel:
    return model_on_a_server_seam(tiny_model_path, tmp_path, AdapterSlots(), trainer_device="cpu").model


async def test_a_step_records_its_input_and_replays_to_the_same_bytes(tiny_model_path, tokenizer, tmp_path):
    model = trainable_on_tiny_model(tiny_model_path, tmp_path)
    config = agentrl.TrainConfig(learning_rate=1e-3, loss="cispo", kl_coef=0.05)
    first = await model.train(synthetic_groups(tokenizer, seed=1, size=3, max_words=10), config)
    second = await model.train(synthetic_groups(tokenizer, seed=2, size=3, max_words=10), config)
    assert (first.step, second.step) == (1, 2)
    recorded = model.run_dir / "checkpoints" / "0002" / STEP_INPUT_FILE
    assert second.metrics["step_input_bytes"] == recorded.stat().st_size > 0
    step_input = read_step_input(recorded.parent)
    assert step_input.config == config and len(step_input.groups) == 3
    assert step_input.conditions.micro_batch_tokens == 2048 and step_input.conditions.ranks == 1
    assert not (model.run_dir / "checkpoints" / "0000" / STEP_INPUT_FILE).exists()  # nothing trained into step 0

    report = replay_step(model.run_dir, 2)
    assert report.identical and report.largest_difference == 0.0 and not report.differing_conditions
    shown = runner.invoke(app, ["replay", str(model.run_dir), "--step", "1"])
    assert shown.exit_code == 0, shown.output
    assert "identical: the same adapter and optimizer state, byte for byte" in shown.output

    # Recorded under other conditions (micro-batches of 64 tokens: the gradients summed in another order),
    # the replay still trains what was recorded; against a checkpoint made otherwise the bytes differ, a
    # little, and the command says where and fails (same conditions, different bytes).
    lines = gzip.decompress(recorded.read_bytes()).decode().splitlines()
    head = json.loads(lines[0])
    head["conditions"]["micro_batch_tokens"] = 64
    recorded.write_bytes(gzip.compress("\n".join([json.dumps(head), *lines[1:]]).encode()))
    report = replay_step(model.run_dir, 2)
    assert not report.identical and 0 < report.largest_difference < 1e-3
    shown = runner.invoke(app, ["replay", str(model.run_dir), "--step", "2"])
    assert shown.exit_code == 1 and "different: largest difference" in shown.output


async def test_replay_says_what_is_missing(tiny_model_path, tokenizer, tmp_path):
    model = trainable_on_tiny_model(tiny_model_path, tmp_path)
    await model.train(synthetic_groups(tokenizer, seed=3, size=2, max_words=6), agentrl.TrainConfig())
    for step, message in [
        (0, "step 0 cannot be trained again"),
        (4, "checkpoint 3 of .* is not there .*keep_last"),
    ]:
        with pytest.raises(agentrl.CheckpointError, match=message):
            replay_step(model.run_dir, step)
    (model.run_dir / "checkpoints" / "0001" / STEP_INPUT_FILE).write_bytes(b"not gzip")
    shown = runner.invoke(app, ["replay", str(model.run_dir), "--step", "1"])
    assert shown.exit_code != 0 and "cannot read the step input" in flat(shown.output)
    (model.run_dir / "checkpoints" / "0001" / STEP_INPUT_FILE).unlink()
    with pytest.raises(agentrl.CheckpointError, match="input was not recorded"):
        replay_step(model.run_dir, 1)


def demonstrations() -> list[agentrl.Trajectory]:
    """Supervised targets with a system prompt, a tool call and its result, and the tools offered."""
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}
    call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    system = {"role": "system", "content": "You answer briefly."}
    return [
        agentrl.Trajectory(messages_and_choices=[system, {"role": "user", "content": f"What is {n} + {n}?"},
                                                 {"role": "assistant", "content": str(2 * n)}])
        for n in (2, 7)
    ] + [
        agentrl.Trajectory(
            messages_and_choices=[system, {"role": "user", "content": "Look it up."},
                                  {"role": "assistant", "content": None, "tool_calls": [call]},
                                  {"role": "tool", "tool_call_id": "c1", "content": "42"},
                                  {"role": "assistant", "content": "It is 42."}],
            tools=[tool],
        )
    ]  # fmt: skip


async def test_a_supervised_call_records_its_demonstrations_and_replays_to_the_same_bytes(
    tiny_model_path, tokenizer, tmp_path
):
    """A `train_sft` call (two epochs of two batches: four optimizer updates, one checkpoint) after a
    GRPO step: its demonstrations and `SFTConfig` are recorded, and replay trains the whole call again."""
    model = trainable_on_tiny_model(tiny_model_path, tmp_path)
    await model.train(synthetic_groups(tokenizer, seed=9, size=2, max_words=6), agentrl.TrainConfig())
    config = agentrl.SFTConfig(learning_rate=1e-3, epochs=2, batch_size=2, micro_batch_tokens=64)
    result = await model.train_sft(demonstrations(), config)
    assert result.step == 2 and result.metrics["step_input_bytes"] > 0
    step_input = read_step_input(model.run_dir / "checkpoints" / "0002")
    assert step_input.supervised and step_input.config == config and not step_input.groups
    assert [(d.messages(), d.tools) for d in step_input.demonstrations] == [
        (d.messages(), d.tools) for d in demonstrations()
    ]
    assert step_input.conditions.micro_batch_tokens == 64
    assert step_input.conditions.batch_micro_batch_tokens == (64, 64, 64, 64)  # each batch's, in order

    report = replay_step(model.run_dir, 2)
    assert report.identical and report.largest_difference == 0.0 and not report.differing_conditions
    assert replay_step(model.run_dir, 1).identical  # the GRPO step before it, as ever

    # A GPU that runs out of memory mid-call halves the micro-batch from that batch on; replay runs each
    # batch at its recorded size, so a record whose first batch ran at 32 tokens (its two demonstrations,
    # 29 and 30 tokens, then apart and not packed as one tree) trains other bytes.
    recorded = model.run_dir / "checkpoints" / "0002" / STEP_INPUT_FILE
    original = recorded.read_bytes()
    lines = gzip.decompress(original).decode().splitlines()
    head = json.loads(lines[0])
    head["conditions"]["batch_micro_batch_tokens"] = [32, 64, 64, 64]
    recorded.write_bytes(gzip.compress("\n".join([json.dumps(head), *lines[1:]]).encode()))
    report = replay_step(model.run_dir, 2)
    assert not report.identical and 0 < report.largest_difference < 1e-2 and not report.differing_conditions
    recorded.write_bytes(original)  # (Adam's four updates at lr 1e-3 carry the rounding up to ~1e-3)
    shown = runner.invoke(app, ["whatif", str(model.run_dir), "--from", "2", "--loss", "gspo", "--name", "sft"])
    assert shown.exit_code != 0 and "step 2 is a supervised step" in flat(shown.output)
    assert not (tmp_path / "p" / "sft").exists()


async def test_whatif_with_the_same_config_repeats_the_steps_and_with_another_loss_differs(
    tiny_model_path, tokenizer, tmp_path
):
    from agentrl.backend.training.replay.whatif import what_if
    from agentrl.records.tracking import read_metrics

    model = trainable_on_tiny_model(tiny_model_path, tmp_path)
    config = agentrl.TrainConfig(learning_rate=1e-3)
    for seed in (4, 5, 6):
        await model.train(synthetic_groups(tokenizer, seed=seed, size=3, max_words=10), config)
    same = what_if(model.run_dir, first=2, steps=2, changes={}, out_dir=tmp_path / "p" / "same")
    assert [s.step for s in same] == [2, 3] and all(s.identical for s in same)
    assert all(s.changed == s.original for s in same)  # loss, KL, grad norm and update size, to the bit
    assert same[0].changed["update_norm"] > 0

    shown = runner.invoke(app, ["whatif", str(model.run_dir), "--from", "2", "--steps", "2", "--loss", "gspo",
                                "--set", "learning_rate=0.0005", "--name", "gspo"])  # fmt: skip
    assert shown.exit_code == 0, shown.output
    other = tmp_path / "p" / "gspo"
    assert [m["step"] for m in read_metrics(other)] == [2, 3]
    assert read_step_input(other / "checkpoints" / "0003").config.loss.name == "gspo"
    assert read_step_input(other / "checkpoints" / "0003").config.learning_rate == 0.0005
    rows = [line.split() for line in shown.output.splitlines() if line.strip().startswith(("2 ", "3 "))]
    assert [row[-1] for row in rows] == ["no", "no"]  # other bytes than the original steps
    assert replay_step(other, 3).identical  # the what-if run is a run like any other: its steps replay

    compared = runner.invoke(app, ["show", str(model.run_dir), "--against", str(other)])
    assert compared.exit_code == 0, compared.output
    rows = [line.split() for line in compared.output.splitlines() if line.strip().startswith(("2 ", "3 "))]
    losses = [{m["step"]: f"{m['loss']:.4g}" for m in read_metrics(run)} for run in (model.run_dir, other)]
    assert [(row[4], row[6]) for row in rows] == [(losses[0][s], losses[1][s]) for s in (2, 3)]  # step 1: original only
    assert all(row[4] != row[6] for row in rows)

    for args, message in [
        (["--from", "2", "--name", "gspo"], "already holds a run"),
        (["--from", "2", "--set", "learning_rate=-1", "--name", "bad"], "not a valid TrainConfig"),
        (["--from", "2", "--set", "nonsense", "--name", "bad"], "write KEY=VALUE"),
        (["--from", "3", "--steps", "2", "--name", "late"], "checkpoint 4 of .* is not there"),
    ]:
        shown = runner.invoke(app, ["whatif", str(model.run_dir), *args])
        assert shown.exit_code != 0 and re.search(message, flat(shown.output)), (args, shown.output)


async def test_a_deterministic_trainer_records_it_and_replay_trains_deterministically_then_restores(
    tiny_model_path, tokenizer, tmp_path, monkeypatch
):
    """`LocalBackend(deterministic=True)`'s trainer: deterministic kernels (what a GPU replay needs; on an
    H100 the default kernels replayed a step up to 7e-5 apart), recorded with each step, and replay
    turns them on for its step and off again after."""
    import torch

    from agentrl.backend.training.placement import TrainerPlacement, start_trainer

    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "")  # recorded, so the teardown puts it back as it was
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    try:
        trainer = start_trainer(tiny_model_path, TrainerPlacement(deterministic=True))
        assert torch.are_deterministic_algorithms_enabled() and os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        trainer.add_adapter("default", agentrl.LoRAConfig())
        outcome = trainer.train_step("default", synthetic_groups(tokenizer, seed=7, size=2), agentrl.TrainConfig())
        assert outcome.conditions is not None and outcome.conditions.deterministic is True
    finally:
        torch.use_deterministic_algorithms(False)

    model = trainable_on_tiny_model(tiny_model_path, tmp_path)
    step_input = model.run_dir / "checkpoints" / "0001" / STEP_INPUT_FILE
    await model.train(synthetic_groups(tokenizer, seed=8, size=2, max_words=6), agentrl.TrainConfig())
    lines = gzip.decompress(step_input.read_bytes()).decode().splitlines()
    head = json.loads(lines[0])
    assert head["conditions"]["deterministic"] is False
    head["conditions"]["deterministic"] = True  # as a deterministic trainer would have recorded it
    step_input.write_bytes(gzip.compress("\n".join([json.dumps(head), *lines[1:]]).encode()))
    seen = []
    real_train_step = Trainer.train_step

    def train_step(self, *args, **kwargs):
        seen.append(torch.are_deterministic_algorithms_enabled())
        return real_train_step(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "train_step", train_step)
    report = replay_step(model.run_dir, 1)
    assert seen == [True] and not torch.are_deterministic_algorithms_enabled()
    assert report.identical  # a CPU step's kernels are deterministic either way


@pytest.mark.slow
@pytest.mark.parametrize("sharded", [False, True], ids=["replicated", "sharded"])
async def test_a_step_of_two_trainer_ranks_replays_on_two_ranks_to_the_same_bytes(
    tiny_model_path, tokenizer, tmp_path, sharded
):
    """Two `torch.distributed` ranks (one core each) train a step; replay starts two ranks too, sharded
    where they were (the report's conditions are the replay's own: no difference means it ran so), and gets
    the same bytes."""
    session = model_on_a_server_seam(
        tiny_model_path, tmp_path, AdapterSlots(), trainer_device="cpu", ranks=2, sharded=sharded
    )
    try:
        config = agentrl.TrainConfig(learning_rate=1e-3, micro_batch_tokens=64)  # micro-batches on each rank
        result = await session.model.train(synthetic_groups(tokenizer, seed=10, size=3, max_words=10), config)
        assert result.metrics["trainer_ranks"] == 2
    finally:
        session.trainer.close()
    conditions = read_step_input(session.model.run_dir / "checkpoints" / "0001").conditions
    assert (conditions.ranks, conditions.sharded) == (2, sharded)
    report = replay_step(session.model.run_dir, 1)
    assert report.identical and not report.differing_conditions, (
        report.largest_difference,
        report.differing_conditions,
    )


@pytest.mark.slow
async def test_a_step_of_the_real_loop_replays_to_the_same_bytes(served_model, tokenizer):
    """A step trained on rollouts from the real server, replayed in this process from its checkpoints."""
    from tests.helpers import alternating_reward_groups

    groups = await alternating_reward_groups(served_model, size=2)
    result = await served_model.train(groups, agentrl.TrainConfig(learning_rate=1e-4))
    assert not result.skipped
    report = replay_step(served_model.run_dir, result.step)
    assert report.identical, (report.largest_difference, report.largest_difference_in, report.differing_conditions)


def test_training_conditions_round_trip_and_read_an_older_checkpoints_record():
    from agentrl.backend.training.step_input import TrainingConditions

    conditions = TrainingConditions.here(512, bf16=False, device="cpu", ranks=2, sharded=True)
    sft = dataclasses.replace(conditions, batch_micro_batch_tokens=(512, 256))
    assert TrainingConditions.from_record(json.loads(json.dumps(sft.as_record()))) == sft
    assert "batch_micro_batch_tokens" not in conditions.as_record() and conditions.threads == torch.get_num_threads()
    older = TrainingConditions.from_record({"micro_batch_tokens": 2048, "threads": 2, "bf16": True, "device": "cpu"})
    assert (older.ranks, older.sharded, older.deterministic, older.torch) == (1, False, False, None)
