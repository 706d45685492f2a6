"""A rubric judge trained on its one-token verdicts: the shipped data (each code-checkable rubric of the base
model's answers, labelled by its check), the command's refusals, and on the real server a verdict judge trained
beside the policy, then rewarding a rubric rollout read from probabilities."""

import json

import pytest

import agentrl
from agentrl.cli import app
from agentrl.judge_training import train_verdict_judge, verdict_accuracy
from agentrl.judges.examples import VerdictExample, load_examples, load_verdict_examples, write_verdict_examples
from agentrl.records.tracking import write_trajectories
from agentrl_environments.rubric.env import load_tasks, rollout
from agentrl_environments.rubric.judge_data import write_from_run
from agentrl_environments.rubric.tasks import DATA, passes
from agentrl_environments.training import judge_for, judge_option
from tests.helpers import flat, runner


def test_the_shipped_verdicts_are_each_rubrics_code_check_on_the_judge_datas_answers():
    tasks = {t.task_id: t for split in ("train", "test") for t in load_tasks(split=split)}
    for split in ("train", "test"):
        verdicts = load_verdict_examples(DATA / f"verdict_{split}.jsonl")
        assert len(verdicts) >= 300 and sum(v.passed for v in verdicts) * 2 == len(verdicts)  # balanced
        for verdict in verdicts[::20]:
            task = tasks[verdict.source.split(" answer ")[0].rsplit(" ", 1)[-1]]
            check = task.checks[task.rubrics.index(verdict.rubric)]
            assert check is not None and passes(check, verdict.response) == verdict.passed
    trained = {v.source.split(" answer ")[0] for v in load_verdict_examples(DATA / "verdict_train.jsonl")}
    assert all(" train " in source for source in trained)


def test_verdict_files_name_a_bad_line_and_the_train_command_refuses_what_a_rubric_judge_cannot_do(tmp_path):
    good = VerdictExample(prompt="Say hi.", response="Hi!", rubric="Says hi.", passed=True)
    path = write_verdict_examples(tmp_path / "v.jsonl", [good, good])
    assert load_verdict_examples(path) == [good, good]
    path.write_text(good.model_dump_json() + "\n" + json.dumps({"prompt": "p"}) + "\n")
    with pytest.raises(agentrl.ConfigurationError, match="v.jsonl:2: not a verdict example"):
        load_verdict_examples(path)
    path = write_verdict_examples(tmp_path / "v.jsonl", [good])
    for extra, says in [
        (["--rl-steps", "2"], "leave --readout and --rl-steps unset with --kind rubric"),
        (["--readout", "json"], "leave --readout and --rl-steps unset with --kind rubric"),
        (["--kind", "pairs"], "--kind must be ruler or rubric"),
    ]:
        kind = [] if "--kind" in extra else ["--kind", "rubric"]
        result = runner.invoke(app, ["judge", "train", "j", "--examples", str(path), *kind, *extra])
        assert result.exit_code != 0 and says in flat(result.output), result.output
    ruler_data = DATA / "judge_train.jsonl"  # RULER's examples are not verdicts
    result = runner.invoke(app, ["judge", "train", "j", "--examples", str(ruler_data), "--kind", "rubric"])
    assert result.exit_code != 0 and "not a verdict example" in flat(result.output)


@pytest.mark.slow
async def test_a_rubric_judge_trained_on_its_verdicts_rewards_a_rubric_rollout(served_model):
    judge = agentrl.TrainableModel(name="verdict-judge", project="tests", base_path=str(served_model.base_path))
    await judge.register(served_model.backend)
    verdicts = load_verdict_examples(DATA / "verdict_train.jsonl")
    # The real parts at the smallest size (two SFT steps; 64 verdicts took 17 s more, bf16 EPYC 2026-12-07): whether
    # such a judge learns is measured at real size by `agentrl judge train --kind rubric` and benchmarks/learning.py.
    passing, failing = [v for v in verdicts if v.passed][:8], [v for v in verdicts if not v.passed][:8]
    held_out = load_verdict_examples(DATA / "verdict_test.jsonl")[:24]
    before = await verdict_accuracy(judge, held_out)
    result = await train_verdict_judge(judge, passing + failing, agentrl.SFTConfig(epochs=1, learning_rate=2e-3))
    assert result.step == 1
    # the result carries the last SFT step's metrics: 8 verdicts of the batch, one loss token each
    assert result.metrics["trained_tokens"] == result.metrics["num_sequences"] == 8, "one loss token: the verdict"
    after = await verdict_accuracy(judge, held_out)
    print(
        f"\nverdict judge (16 verdicts, 2 SFT steps): held-out accuracy {before['accuracy']:.2f} -> {after['accuracy']:.2f}"
    )
    assert after["n"] == 24 and 0.0 <= after["p_yes_failing"] <= 1.0 and after != before  # the adapter changed

    # `--reward rubric --judge run:tests/verdict-judge` names it; a RULER reward is refused, naming the fix.
    spec = {"base_path": str(served_model.base_path), "base_model": served_model.base_model}
    with pytest.raises(agentrl.ConfigurationError, match="trained as a rubric judge.*--reward rubric"):
        judge_option("run:tests/verdict-judge", ruler=True, **spec)
    named = judge_option("run:tests/verdict-judge", ruler=False, **spec)
    assert isinstance(named, agentrl.TrainableModel)
    await named.register(served_model.backend)
    task = load_tasks(split="train")[0]
    trajectory = await rollout(
        served_model, task, judge=judge_for(served_model, named), max_tokens=48, readout="probabilities"
    )
    assert trajectory.reward == trajectory.metrics["pass_rate"] and 0.0 <= trajectory.reward <= 1.0
    assert len([line for line in trajectory.logs if "read from probabilities" in line]) == len(task.rubrics)
    assert "judge_audited" not in trajectory.metrics  # each rubric asked alone: no order to audit


def test_policy_judge_data_comes_from_a_runs_recorded_answers_balanced_within_each_step(tmp_path):
    """`judge_data --from-run`: a run's training groups and held-out answers (recorded one a group) become RULER
    examples and verdicts labelled by the checks, not by the run's reward, with as many passing as failing
    verdicts from each step; a folder with no records is refused, naming what to pass."""
    train_task = next(t for t in load_tasks(split="train") if t.task_id == "refund-236")
    test_task = next(t for t in load_tasks(split="test") if t.task_id == "tips-077")

    def answered(task, text, reward):  # the run's reward is wrong on purpose: the checks label the data
        messages = [{"role": "user", "content": task.prompt}, {"role": "assistant", "content": text}]
        return agentrl.Trajectory(messages_and_choices=messages, reward=reward, metadata={"task_id": task.task_id})

    good, bad = "The blender can go back until October 15. Dev", "Sorry, no."
    run = tmp_path / "run"
    for step in (1, 2):
        group = agentrl.TrajectoryGroup([answered(train_task, good, 0.0), answered(train_task, bad, 1.0)])
        write_trajectories(run, step, "train", [group])
    bullets = "- one\n- two\n- three\n- four"
    write_trajectories(
        run, 0, "val", [agentrl.TrajectoryGroup([answered(test_task, a, 0.0)]) for a in (bullets, "- one")]
    )
    written = write_from_run(run, tmp_path)
    examples = load_examples(tmp_path / "judge_policy_train.jsonl")
    assert [e.labels for e in examples] == [[1.0, 0.25], [1.0, 0.25]]  # max_words passes for both
    assert examples[0].source == "rubric train train-0001 refund-236" and "refund deadline" in examples[0].rubric
    test_examples = load_examples(tmp_path / "judge_policy_test.jsonl")
    assert [e.labels for e in test_examples] == [[1.0, 0.0]]  # the two held-out answers, grouped by step and task
    verdicts = load_verdict_examples(tmp_path / "verdict_policy_train.jsonl")
    for step in ("train-0001", "train-0002"):
        of_step = [v for v in verdicts if f" {step} " in v.source]
        assert sum(v.passed for v in of_step) * 2 == len(of_step) == 6  # 3 failing checks a step, 3 of 5 passing
    for verdict in verdicts:
        check = train_task.checks[train_task.rubrics.index(verdict.rubric)]
        assert passes(check, verdict.response) == verdict.passed
    assert written == {"train": 12, "test": 2}
    with pytest.raises(agentrl.ConfigurationError, match="no recorded train trajectories.*runs under"):
        write_from_run(tmp_path / "empty", tmp_path)
