"""A judge trained on labelled judgements: the data (from groups that kept a check), the demonstrations
it learns from, and on the real server a judge adapter trained beside the policy, checked on held-out
labels before and after, then judging a policy step."""

import asyncio
import json

import pytest

import agentrl
from agentrl.cli import app
from agentrl.judge_training import agreement_reward, judge_histories, train_judge, train_judge_rl
from agentrl.judges import trained_judge
from agentrl.judges.examples import JudgeExample, examples_from_groups, load_examples, write_examples
from agentrl.judges.ruler import scores_schema
from agentrl.records.checkpoints import CheckpointStore
from agentrl_environments.larger_number.judge_data import DATA as LARGER_NUMBER_DATA
from agentrl_environments.larger_number.judge_data import RUBRIC
from agentrl_environments.larger_number.task import rollout, scenarios
from agentrl_environments.training import judge_option
from tests.helpers import flat, make_run, runner


def answered(prompt: str, answers: list[tuple[str, float]]) -> agentrl.TrajectoryGroup:
    return agentrl.TrajectoryGroup(
        agentrl.Trajectory(
            reward=reward,
            messages_and_choices=[{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}],
        )
        for answer, reward in answers
    )


def test_examples_come_from_groups_with_a_check_and_round_trip_through_jsonl(tmp_path):
    tied = answered("q", [("a", 1.0), ("b", 1.0)])
    judged = answered("q", [("a", 0.2), ("b", 0.9)])
    for trajectory, checked in zip(judged.trajectories, [1.0, 0.0]):  # a RULER run kept the check aside
        trajectory.metrics["independent_reward"] = checked
    examples = examples_from_groups([tied, judged, answered("q", [("a", 3.0), ("b", -1.0)])], source="run@2")
    assert [e.labels for e in examples] == [[1.0, 0.0], [1.0, 0.0]]  # ties teach nothing; labels clipped
    path = write_examples(tmp_path / "judge.jsonl", examples)
    assert load_examples(path) == examples
    path.write_text(path.read_text() + '{"message_lists": [], "labels": []}\n')
    with pytest.raises(agentrl.ConfigurationError, match=r"judge.jsonl:3: not a judge example"):
        load_examples(path)
    with pytest.raises(ValueError, match="2 labels for 3 attempts"):
        JudgeExample(message_lists=[[{"role": "user", "content": "x"}]] * 3, labels=[0.0, 1.0])


@pytest.mark.parametrize("environment", ["rubric", "email_agent", "larger_number"])
def test_the_shipped_judge_data_is_labelled_by_the_task_check_and_holds_out_other_tasks(environment):
    from pathlib import Path

    import agentrl_environments

    data = Path(agentrl_environments.__file__).parent / environment / "data"
    train, test = load_examples(data / "judge_train.jsonl"), load_examples(data / "judge_test.jsonl")
    assert len(train) >= 12 and len(test) >= 6
    for example in train + test:
        assert len(example.labels) == len(example.message_lists) >= 2
        assert all(0.0 <= label <= 1.0 for label in example.labels) and len(set(example.labels)) > 1
    asked = lambda examples: {json.dumps(e.message_lists[0][:2]) for e in examples}  # noqa: E731  (system + task)
    assert not asked(train) & asked(test), "a held-out task is also a training task"


def test_a_split_holds_out_every_nth_example_and_refuses_to_hold_out_all():
    from agentrl_environments.email_agent.judge_data import split_examples

    def asked(question: str) -> JudgeExample:
        attempt = [{"role": "user", "content": question}, {"role": "assistant", "content": "an answer"}]
        return JudgeExample(message_lists=[attempt, attempt], labels=[0.0, 1.0])

    examples = [asked(q) for q in ("a", "b", "c", "a", "d", "e", "f", "c")]  # "a" and "c" asked twice
    train, test = split_examples(examples, 3)
    assert test == [examples[2], examples[6], examples[7]]  # the 3rd and 6th questions, each time asked
    assert train == [examples[i] for i in (0, 1, 3, 4, 5)]
    with pytest.raises(ValueError, match="at least 2"):
        split_examples(examples, 1)


def test_each_example_is_shown_in_several_orders_answered_with_its_labels():
    (example,) = examples_from_groups([answered("Which is larger, 3 or 9?", [("9", 1.0), ("3", 0.0), ("5", 0.5)])])
    histories = judge_histories([example], orders=4, seed=1)
    assert len(histories) == 4
    for history in histories:
        prompt, answer = history.messages()[1]["content"], json.loads(history.messages()[-1]["content"])
        scores_schema(3).model_validate(answer)  # exactly what RULER asks the judge for
        shown = [prompt.index(f'"content": "{a}"') for a in ("9", "3", "5")]
        by_position = sorted(zip(shown, [1.0, 0.0, 0.5]))  # the labels, in the order the attempts are shown
        assert [answer[f"trajectory_{k}"]["score"] for k in (1, 2, 3)] == [label for _, label in by_position]
    assert len({h.messages()[1]["content"] for h in histories}) > 1, "shuffled orders, not one order four times"


def test_agreement_reward_counts_the_label_pairs_a_judgement_orders_the_same_way():
    assert agreement_reward([1.0, 0.0, 0.5], [0.9, 0.1, 0.5]) == 1.0
    assert agreement_reward([1.0, 0.0, 0.5], [0.1, 0.9, 0.5]) == 0.0
    assert agreement_reward([1.0, 0.0], [0.7, 0.7]) == 0.5  # a tie is what a guessing judge earns
    assert (
        agreement_reward([1.0, 0.0, 0.0], [1.0, 0.0, 1.0]) == 0.75
    )  # one pair right, one tied; the labels' tie unasked


async def test_held_out_examples_are_judged_with_their_own_rubric(fake, judge):
    examples = [
        JudgeExample(
            message_lists=[[{"role": "user", "content": "q"}, {"role": "assistant", "content": a}] for a in ("x", "y")],
            labels=[1.0, 0.0],
            rubric=f"- rubric number {k}",
        )
        for k in range(2)
    ]
    groups = [e.group() for e in examples]
    assert [t.reward for t in groups[0].trajectories] == [1.0, 0.0] and groups[1].metadata[
        "rubric"
    ] == "- rubric number 1"
    await agentrl.check_judge(groups, judge, permutations=1, repeats=0)
    prompts = [r["messages"][1]["content"] for r in fake.requests]
    assert sum("- rubric number 0" in p for p in prompts) == 2 and sum("- rubric number 1" in p for p in prompts) == 2


def test_a_trained_judge_is_named_by_its_run_and_refused_where_it_cannot_judge(tmp_path):
    with pytest.raises(agentrl.ConfigurationError, match="no run 'judges/missing'"):
        trained_judge("run:missing", base_path=tmp_path, base_model="smollm2-135m-instruct")
    store = CheckpointStore(tmp_path / "judges" / "fair")
    adapter = {
        "r": 4,
        "lora_alpha": 8,
        "target_modules": ["v_proj", "q_proj"],
        "base_model_name_or_path": "/c/smollm2-135m-instruct",
    }
    write = lambda folder: (folder / "adapter_config.json").write_text(json.dumps(adapter))  # noqa: E731
    store.save(0, write, {})
    with pytest.raises(agentrl.ConfigurationError, match="no trained checkpoint.*agentrl judge train fair"):
        trained_judge("run:fair", base_path=tmp_path, base_model="smollm2-135m-instruct")
    store.save(1, write, {})
    judge = trained_judge("run:fair", base_path=tmp_path, base_model="smollm2-135m-instruct")
    assert (judge.project, judge.name, judge.lora.rank, judge.lora.alpha) == ("judges", "fair", 4, 8)
    assert judge.run_dir.resolve() == store.root.parent.resolve()
    assert trained_judge("run:judges/fair", base_path=tmp_path, base_model="smollm2-135m-instruct").name == "fair"
    # A judge is read the way it was trained to answer (recorded in its run; "json" before agentrl recorded it).
    assert trained_judge("run:fair", base_path=tmp_path, base_model="smollm2-135m-instruct", readout="json")
    (tmp_path / "judges" / "fair" / "judge.json").write_text('{"readout": "probabilities"}')
    with pytest.raises(agentrl.ConfigurationError, match="readout 'probabilities'.*--judge-readout probabilities"):
        trained_judge("run:fair", base_path=tmp_path, base_model="smollm2-135m-instruct", readout="json")
    with pytest.raises(agentrl.ConfigurationError, match="trained on base model 'smollm2-135m-instruct'.*Qwen"):
        trained_judge("run:fair", base_path=tmp_path, base_model="Qwen/Qwen2.5-3B-Instruct")
    assert judge_option("openai/o4-mini", base_path=str(tmp_path), base_model="m", ruler=False) == "openai/o4-mini"
    with pytest.raises(agentrl.ConfigurationError, match="trained as a ruler judge.*use it with --reward ruler"):
        judge_option("run:fair", base_path=str(tmp_path), base_model="smollm2-135m-instruct", ruler=False)


def test_judge_examples_and_judge_train_commands_take_a_run_and_refuse_bad_files(tmp_path):
    make_run(tmp_path)
    out = tmp_path / "examples.jsonl"
    result = runner.invoke(app, ["judge", "examples", "demo/agent-1", "--out", str(out), "--base-path", str(tmp_path)])
    assert result.exit_code == 0, result.output
    examples = load_examples(out)
    assert len(examples) == 2 and all(e.labels == [1.0, 0.0] for e in examples)  # one group per recorded step
    assert examples[0].source == "demo/agent-1 (train)"
    result = runner.invoke(app, ["judge", "train", "j", "--examples", str(tmp_path / "none.jsonl")])
    assert result.exit_code != 0 and "no examples file at" in flat(result.output)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"labels": [1]}\n')
    result = runner.invoke(app, ["judge", "train", "j", "--examples", str(bad)])
    shown = flat(result.output)  # rich folds a long path anywhere: the file and line are checked without spaces
    assert result.exit_code != 0 and "not a judge example" in shown and "bad.jsonl:1:" in "".join(shown.split())
    result = runner.invoke(app, ["judge", "train", "j", "--examples", str(out), "--epochs", "0"])
    assert result.exit_code != 0 and "nothing to train" in flat(result.output)
    result = runner.invoke(app, ["judge", "train", "j", "--examples", str(out), "--orders", "3"])
    assert result.exit_code != 0 and "--orders does not apply with readout='probabilities'" in flat(result.output)
    check = ["judge", "check", "demo/agent-1", "--judge", "run:nobody", "--base-path", str(tmp_path)]
    result = runner.invoke(app, check)  # named before any server starts
    assert result.exit_code != 0 and "no run 'judges/nobody'" in flat(result.output)


@pytest.mark.slow
async def test_a_judge_trained_on_its_decision_learns_it_and_judges_a_step(served_model):
    """The real parts at the smallest size: SFT on the decision tokens, an RL step on agreement, the trained
    adapter read from probabilities, then named by its run and judging a policy step. Whether such a judge learns is a
    matter of size (about 64 SFT steps before the held-out readout moves: 32 moved nothing on 2026-12-06, and
    neither did 16 to 24 steps at lr 1e-2 on the trained questions themselves), so it is measured where the
    real size runs: `python -m benchmarks.judge_training --data larger-number --readout probabilities`
    (benchmarks/results/judge_training.json: SFT on 384 examples, held-out pairwise accuracy 0.48 -> 0.98 on 96)."""
    judge = agentrl.TrainableModel(name="judge", project="tests", base_path=str(served_model.base_path))
    await judge.register(served_model.backend)
    # Bare numbers (the check's own pairs): questions never trained on.
    bare = lambda path: [e for e in load_examples(path) if e.message_lists[0][-1]["content"].isdigit()]  # noqa: E731
    held_out = [e.group() for e in bare(LARGER_NUMBER_DATA / "judge_test.jsonl")[:8]]
    examples = bare(LARGER_NUMBER_DATA / "judge_train.jsonl")[:8]
    config = agentrl.SFTConfig(epochs=1, batch_size=8)
    first = await train_judge(judge, examples, config, readout="probabilities")
    assert first.step == 1
    assert first.metrics["trained_tokens"] == first.metrics["num_sequences"], "one loss token each: the decision"
    # The same demonstrations again (one batch of 8 decisions): their loss falls as the judge learns them.
    again = await train_judge(judge, examples, config, readout="probabilities")
    assert again.step == 2 and again.metrics["sft_loss"] < first.metrics["sft_loss"]  # seen: 2.80 -> 0.88
    # Then RL on agreement: the judge samples its one-token decision on a pair and is rewarded by the labels.
    (rl,) = await train_judge_rl(
        judge, examples, steps=1, examples_per_step=4, samples_per_example=4, readout="probabilities"
    )
    assert rl.metrics["num_trajectories"] == 16 and 0.0 <= rl.metrics["reward_mean"] <= 1.0
    judged = await asyncio.gather(
        *(agentrl.ruler_score_group(g, judge, readout="probabilities", audit=None) for g in held_out)
    )  # at once, as a step's groups are judged: the server batches them
    assert all(g.metrics["judge_read_from_probabilities"] == 1.0 for g in judged)
    report = await agentrl.check_judge(held_out, judge, permutations=1, repeats=0, readout="probabilities")
    assert report.readout == "probabilities" and report.failed_calls == 0

    # `--judge run:tests/judge` names this judge, read the way it was trained; asked for JSON, it is refused.
    spec = {"base_path": str(served_model.base_path), "base_model": served_model.base_model, "ruler": True}
    with pytest.raises(agentrl.ConfigurationError, match="trained to answer with readout 'probabilities'"):
        judge_option("run:tests/judge", readout="json", **spec)
    named = judge_option("run:tests/judge", readout="probabilities", **spec)
    assert isinstance(named, agentrl.TrainableModel) and named.run_dir.resolve() == judge.run_dir.resolve()
    await named.register(served_model.backend)  # already served here: registering returns its step
    trained_step = await judge.get_step()
    assert await named.get_step() == trained_step >= 1

    policy = agentrl.TrainableModel(name="judged-policy", project="tests", base_path=str(served_model.base_path))
    await policy.register(served_model.backend)  # a fresh policy: its attempts still disagree
    groups = await agentrl.gather_trajectory_groups(
        [agentrl.TrajectoryGroup(rollout(policy, s) for _ in range(4)) for s in scenarios("train", 4, seed=31)],
        after_each=lambda g: agentrl.ruler_score_group(
            g, named, readout="probabilities", rubric=RUBRIC, swallow_exceptions=True
        ),
        show_progress=False,
    )
    assert await judge.get_step() == trained_step, "the judge's adapter stays where it was trained while it judges"
    assert all(g.metrics["judge_read_from_probabilities"] == 1.0 for g in groups)
    step = await policy.train(groups, agentrl.TrainConfig(learning_rate=1e-5))
    assert not step.skipped and step.step == 1
