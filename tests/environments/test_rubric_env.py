"""The judge-only environment: shipped tasks, code checks, a user's task file, the CLI, and the real loop."""

import asyncio
import json
from dataclasses import replace

import pytest
from typer.testing import CliRunner

import agentrl
from agentrl.cli import app
from agentrl.records.tracking import read_metrics, write_trajectories
from agentrl_environments.rubric.env import evaluate, load_tasks, rollout, ruler_rewards
from agentrl_environments.rubric.generate import generate
from agentrl_environments.rubric.tasks import Check, InstructionTask, checked_pass_rate, passes, sentences
from agentrl_environments.rubric.train import PRESETS, run, splits
from agentrl_environments.training import judge_for
from tests.fake_openai import FakeOpenAI
from tests.helpers import flat


def test_shipped_tasks_are_distinct_split_and_aligned():
    train, test = load_tasks(split="train"), load_tasks(split="test")
    assert (len(train), len(test)) == (240, 60)
    assert not {t.task_id for t in train} & {t.task_id for t in test}
    assert len({t.prompt for t in train + test}) == 300
    for task in train + test:
        assert len(task.eval_rubrics or []) == len(task.rubrics) == len(task.checks or [])
        assert task.eval_rubrics != task.rubrics  # evaluation asks in other words
    assert [t.model_dump() for t in generate()] == [t.model_dump() for t in generate()]  # seeded


def test_code_checks_by_hand():
    assert passes(Check(kind="contains", values=["Maria"]), "Dear maria, thanks!")
    assert not passes(Check(kind="contains", values=["Maria"]), "Dear Tom")
    assert passes(Check(kind="max_words", count=5), "Thanks for the lovely flowers!")
    assert not passes(Check(kind="max_words", count=3), "Thanks for the lovely flowers!")
    assert not passes(Check(kind="max_words", count=3), "")  # an empty answer passes no length rubric
    assert passes(Check(kind="bullets", count=2), "Tips:\n- sleep early\n- no screens")
    assert not passes(Check(kind="bullets", count=2), "- one\n- two\n- three")
    assert sentences("The lunch is on Monday at 1 PM. Meet in the kitchen!") == 2
    assert sentences("Paris is the capital of France.") == 1
    task = InstructionTask(
        task_id="t",
        prompt="p",
        rubrics=["a", "b", "c"],
        checks=[Check(kind="contains", values=["x"]), None, Check(kind="max_words", count=2)],
    )
    assert checked_pass_rate(task, "x y z") == 0.5  # only the checkable rubrics count
    assert checked_pass_rate(InstructionTask(task_id="u", prompt="p", rubrics=["a"]), "x") is None
    with pytest.raises(ValueError, match="one entry per rubric"):
        InstructionTask(task_id="t", prompt="p", rubrics=["a", "b"], eval_rubrics=["only one"])


def test_a_users_task_file_trains_and_a_bad_one_names_its_line(tmp_path):
    path = tmp_path / "mine.jsonl"
    rows = [{"task_id": f"m{i}", "prompt": f"Say hi to person {i}.", "rubrics": ["Says hi."]} for i in range(10)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    train, test = splits(str(path))
    assert [t.task_id for t in train] == [f"m{i}" for i in range(8)] and [t.task_id for t in test] == ["m8", "m9"]
    path.write_text(json.dumps(rows[0]) + "\n" + json.dumps({"task_id": "x", "prompt": "p"}) + "\n")
    with pytest.raises(ValueError, match="mine.jsonl:2"):
        splits(str(path))
    with pytest.raises(FileNotFoundError, match="no rubric task file"):
        splits(str(tmp_path / "missing.jsonl"))


def test_cli_options_for_tasks_and_judges_are_checked(tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["train", "2048", "--tasks", str(tmp_path / "x.jsonl")])
    assert result.exit_code != 0 and "--tasks applies to: rubric" in flat(result.output)
    result = runner.invoke(app, ["train", "rubric", "--tasks", str(tmp_path / "missing.jsonl")])
    assert result.exit_code != 0 and "no task file" in flat(result.output)
    result = runner.invoke(app, ["train", "email", "--judge", "openai/o4-mini"])
    assert result.exit_code != 0 and "--judge needs --reward judge or --reward ruler" in flat(result.output)
    result = runner.invoke(app, ["train", "rubric", "--reward", "match"])
    assert result.exit_code != 0 and "rubric, ruler, ruler-generic" in flat(result.output)


async def test_the_checked_reward_needs_a_code_check_on_every_task(tmp_path):
    path = tmp_path / "mine.jsonl"
    rows = [{"task_id": f"m{i}", "prompt": f"Say hi to person {i}.", "rubrics": ["Says hi."]} for i in range(10)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(agentrl.ConfigurationError, match=r"--reward checked: 8 training task\(s\) have no code check"):
        await run(reward="checked", tasks=str(path), base_path=str(tmp_path))
    result = CliRunner().invoke(app, ["train", "rubric", "--reward", "checked", "--judge", "openai/o4-mini"])
    assert result.exit_code != 0 and "--judge needs --reward rubric or --reward ruler" in flat(result.output)


def test_judge_check_command_on_a_recorded_run_with_a_priced_api_stand_in(tmp_path, monkeypatch):
    """`agentrl judge check` end to end; the judge is a local server speaking OpenAI's protocol."""
    from tests.helpers import graded_groups

    run_dir = tmp_path / "proj" / "run"
    write_trajectories(run_dir, 1, "train", graded_groups(4))
    fake = FakeOpenAI(score_mode="oracle")
    monkeypatch.setenv("OPENAI_API_BASE", fake.base_url)
    monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "test")
    try:
        result = CliRunner().invoke(
            app, ["judge", "check", "proj/run", "--base-path", str(tmp_path), "--judge", "openai/gpt-4o-mini"]
        )
    finally:
        fake.close()
    assert result.exit_code == 0, result.output
    assert "1.00 [1.00, 1.00] of 24 pairs" in flat(result.output)
    assert "$ per step" in flat(result.output) and "unpriced" not in flat(result.output)  # litellm prices this model id
    saved = json.loads(next((run_dir / "judge_checks").glob("*.json")).read_text())
    assert saved[0]["usd_per_step"] > 0 and saved[0]["groups_per_step"] == 4
    result = CliRunner().invoke(app, ["judge", "check", "proj/run", "--base-path", str(tmp_path)])
    assert result.exit_code != 0 and "no checkpoint to read its base model from" in flat(result.output)


@pytest.mark.slow
async def test_rubric_environment_trains_on_judge_rewards_and_the_judge_is_checked(served_model):
    """The real loop with the base model as judge: rubric rewards, RULER rewards, a step, the eval
    wording, and a judge check of the recorded groups against the code-checked pass rate."""
    tasks = load_tasks(split="train")[:2]
    judge = judge_for(served_model, None)
    rubric_group = agentrl.TrajectoryGroup(
        rollout(served_model, tasks[0], judge=judge, max_tokens=48) for _ in range(3)
    )
    ruler_group = agentrl.TrajectoryGroup(rollout(served_model, tasks[1], max_tokens=48) for _ in range(3))
    checked_group = agentrl.TrajectoryGroup(
        rollout(served_model, tasks[1], max_tokens=48, reward_from_checks=True) for _ in range(3)
    )
    (judged_by_rubric,), (checked,), (judged_by_ruler,) = await asyncio.gather(  # at once: the server batches
        agentrl.gather_trajectory_groups([rubric_group], max_exception_rate=0.67, show_progress=False),
        agentrl.gather_trajectory_groups([checked_group], show_progress=False),
        agentrl.gather_trajectory_groups(
            [ruler_group],
            after_each=ruler_rewards(served_model, None, {t.task_id: t for t in tasks}, with_rubrics=True),
            show_progress=False,
        ),
    )
    assert judged_by_rubric.trajectories, f"the local judge failed every answer: {judged_by_rubric.exceptions}"
    for t in judged_by_rubric.trajectories:
        assert t.reward == t.metrics["pass_rate"] and "independent_reward" in t.metrics
        assert len([line for line in t.logs if line.startswith("rubric ")]) == len(tasks[0].rubrics)
    assert judged_by_ruler.trajectories, f"RULER failed: {judged_by_ruler.exceptions}"
    for t in judged_by_ruler.trajectories:
        assert t.reward == t.metrics["ruler_score"]
        assert t.metrics["independent_reward"] == checked_pass_rate(tasks[1], t.messages()[-1]["content"] or "")
    for t in checked.trajectories:  # the ceiling's reward: the code checks themselves, no judge asked
        assert t.reward == t.metrics["independent_reward"] == checked_pass_rate(tasks[1], t.messages()[-1]["content"])
        assert "pass_rate" not in t.metrics
    await served_model.train([judged_by_rubric, judged_by_ruler], agentrl.TrainConfig(learning_rate=1e-4))
    record = [r for r in read_metrics(served_model.run_dir) if r["split"] == "train"][-1]  # trained or skipped
    assert "independent_reward" in record  # beside the judge's reward, for reward.png's hacking flag
    held_out = await evaluate(
        served_model, load_tasks(split="test")[:1], judge, replace(PRESETS["cpu"], test_samples=2)
    )
    assert held_out and all("pass_rate" in t.metrics for t in held_out)
    assert len(held_out) <= 2 and {t.metadata["task_id"] for t in held_out} == {"tips-077"}
    report = await agentrl.check_judge(
        [judged_by_ruler], judge, permutations=1, repeats=1, extra_litellm_params={"max_tokens": 1024}
    )
    assert report.groups == 1 and report.calls == 3 and report.reference == "independent_reward"
    assert report.latency_s_mean > 0 and report.prompt_tokens_per_group > 0 and report.usd_per_group is None
    assert 0.0 <= report.repeat_identical_fraction <= 1.0
