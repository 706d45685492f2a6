"""The run's record of consumed scenarios: a committed step's scenarios are trained once, a skipped step's
are consumed too, a failed or killed step's are not, and `iterate_dataset` resumes from the record. The
real trainer and step transaction on the tiny model; the kill -9 trial is in test_resume."""

from __future__ import annotations

import asyncio

import pytest

import agentrl
from agentrl.client.dataset import content_ids
from agentrl.records.scenario_record import record_step, trained_scenarios, void_after
from tests.helpers import AdapterSlots, model_on_a_server_seam, synthetic_groups


def test_iterate_dataset_leaves_out_trained_scenarios_and_names_each_group():
    dataset = [f"s{i}" for i in range(5)]
    full = list(agentrl.iterate_dataset(dataset, batch_size=2, epochs=2, show_progress=False))
    assert [len(b.keys) for b in full] == [2, 2, 1, 2, 2, 1]
    ids = content_ids(dataset)
    assert {k for b in full for k in b.keys} == {f"{e}:{i}" for e in (0, 1) for i in ids}
    first = full[0]
    assert [dataset[ids.index(k.split(":")[1])] for k in first.keys] == first.items  # a key names its item
    trained = {*full[0].keys, full[1].keys[0], *full[2].keys}  # batch 1 half trained, batch 2 whole
    resumed = list(
        agentrl.iterate_dataset(dataset, batch_size=2, epochs=2, already_trained=trained, show_progress=False)
    )
    assert [b.step for b in resumed] == [1, 3, 4, 5]  # an emptied batch is not yielded
    assert resumed[0].keys == [full[1].keys[1]] and resumed[0].items == [full[1].items[1]]
    groups = resumed[0].groups(lambda item: agentrl.TrajectoryGroup(metadata={"split": "train"}))
    assert [g.metadata for g in groups] == [{"split": "train", "scenario": full[1].keys[1]}]

    # Keys come from content: a dataset rebuilt larger and in another order (larger-number's grows with
    # --steps) resumes with exactly the scenarios not trained yet, each repeated item is its own scenario,
    # and items that are not data fall back to their index.
    grown = [*reversed(dataset), "s5", "s6"]
    rest = [
        k
        for b in agentrl.iterate_dataset(grown, batch_size=2, already_trained=trained, show_progress=False)
        for k in b.keys
    ]
    assert sorted(rest) == sorted({f"0:{i}" for i in content_ids(grown)} - trained)
    assert len(set(content_ids(["a", "b", "a", {"n": 1}, {"n": 1}]))) == 5
    assert content_ids([{"n": 1}]) == content_ids([{"n": 1}]) != content_ids([{"n": 2}])
    assert content_ids([object(), object()]) == ["0", "1"]

    named = next(agentrl.iterate_dataset(dataset, scenario_id=lambda s: s.upper(), shuffle=False, show_progress=False))
    assert named.keys == ["0:S0"]
    with pytest.raises(agentrl.ConfigurationError, match="pass only already_trained"):
        next(agentrl.iterate_dataset(dataset, initial_step=1, already_trained={"0:1"}))
    with pytest.raises(agentrl.ConfigurationError, match="the same id"):
        next(agentrl.iterate_dataset(dataset, scenario_id=len))


def test_a_line_counts_once_its_step_committed_and_a_void_drops_what_never_did(tmp_path):
    record = tmp_path / "scenarios.jsonl"
    assert trained_scenarios(record, 5) == {}
    record_step(record, 1, ["0:0", "0:1"])
    record_step(record, 2, ["0:2"])  # write-ahead of a step the process was killed in
    assert trained_scenarios(record, 1) == {"0:0": [1], "0:1": [1]}
    void_after(record, 1)  # the run resumed at 1
    record_step(record, 2, ["0:3"])  # step 2 again, on other scenarios
    assert trained_scenarios(record, 2) == {"0:0": [1], "0:1": [1], "0:3": [2]}
    with record.open("a") as torn:
        torn.write('{"step": 3, "scena')  # a crash in the middle of a line
    assert trained_scenarios(record, 3) == {"0:0": [1], "0:1": [1], "0:3": [2]}


async def test_committed_and_skipped_steps_record_their_scenarios_and_a_failed_step_none(
    tiny_model_path, tokenizer, tmp_path
):
    with pytest.raises(agentrl.AgentRLError, match="register"):
        agentrl.TrainableModel(name="m", project="p", base_path=str(tmp_path)).trained_scenarios()
    model = model_on_a_server_seam(tiny_model_path, tmp_path, AdapterSlots(), trainer_device="cpu").model
    dataset = list(range(10))
    batches = list(agentrl.iterate_dataset(dataset, batch_size=2, show_progress=False))
    pool = synthetic_groups(tokenizer, seed=3, size=2, num_groups=10, max_words=6)
    config = agentrl.TrainConfig(learning_rate=1e-3)

    first = await model.train(batches[0].groups(lambda i: pool[i]), config)
    assert first.step == 1 and model.trained_scenarios() == {k: [1] for k in batches[0].keys}

    def equal_rewards(i: int) -> agentrl.TrajectoryGroup:
        return agentrl.TrajectoryGroup([t.model_copy(update={"reward": 0.5}) for t in pool[i]])

    skipped = await model.train(batches[1].groups(equal_rewards), config)
    assert skipped.skipped and skipped.step == 1
    assert model.trained_scenarios() == {k: [1] for k in [*batches[0].keys, *batches[1].keys]}

    def no_reward(i: int) -> agentrl.TrajectoryGroup:
        return agentrl.TrajectoryGroup([t.model_copy(update={"reward": float("nan")}) for t in pool[i]])

    with pytest.raises(agentrl.RewardError):
        await model.train(batches[2].groups(no_reward), config)
    assert set(model.trained_scenarios()) == {*batches[0].keys, *batches[1].keys}  # nothing of it trained

    left = list(agentrl.iterate_dataset(dataset, batch_size=2, already_trained=model.trained_scenarios()))
    assert [b.keys for b in left] == [batches[2].keys, batches[3].keys, batches[4].keys]
    again = await model.train(left[0].groups(lambda i: pool[i]), config)
    assert again.step == 2

    # Cancelled (Ctrl-C) after the backend committed the step, while its files were being written: the
    # next call asks the backend which step is committed, and the cancelled step's scenarios stay trained.
    backend = model.backend
    committing = backend.train

    async def commits_then_cancelled(*args, **kwargs):
        await committing(*args, **kwargs)
        raise asyncio.CancelledError

    backend.train = commits_then_cancelled
    with pytest.raises(asyncio.CancelledError):
        await model.train(batches[3].groups(lambda i: pool[i]), config)
    del backend.train
    last = await model.train(batches[4].groups(lambda i: pool[i]), config)
    assert last.step == 4
    trained = model.trained_scenarios()
    assert sorted(trained) == sorted(f"0:{i}" for i in content_ids(dataset)) and all(
        len(s) == 1 for s in trained.values()
    )
    assert [trained[k] for k in [*batches[3].keys, *batches[4].keys]] == [[3], [3], [4], [4]]


async def test_a_group_the_judge_dropped_is_consumed_by_the_next_pipelined_step(tiny_model_path, tokenizer, tmp_path):
    model = model_on_a_server_seam(tiny_model_path, tmp_path, AdapterSlots(), trainer_device="cpu").model
    batches = list(agentrl.iterate_dataset(list(range(6)), batch_size=3, shuffle=False, show_progress=False))
    pool = synthetic_groups(tokenizer, seed=4, size=2, num_groups=6, max_words=6)
    refused = batches[0].keys[1]

    async def judge(group: agentrl.TrajectoryGroup) -> agentrl.TrajectoryGroup | None:
        return None if group.metadata["scenario"] == refused else group

    results = await agentrl.train_pipelined(
        model,
        lambda model, step: batches[step].groups(lambda i: pool[i]),
        steps=2,
        max_steps_off_policy=0,
        config=agentrl.TrainConfig(learning_rate=1e-3),
        after_each=judge,
    )
    assert [r.step for r in results] == [1, 2]
    trained = model.trained_scenarios()
    # Never trained, but consumed: a resumed run does not sample it again, as an uninterrupted one would not.
    assert sorted(trained) == sorted(k for b in batches for k in b.keys) and trained[refused] in ([1], [2])
    assert not list(agentrl.iterate_dataset(list(range(6)), batch_size=3, already_trained=trained))
