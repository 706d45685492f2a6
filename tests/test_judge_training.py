"""A judge trained on labelled judgements: the data (from groups that kept a check), the demonstrations
it learns from, and on the real server a judge adapter trained beside the policy, checked on held-out
labels before and after, then judging a policy step."""

import json

import pytest

import agentrl
from agentrl.judges.ruler import scores_schema
from agentrl.judges.training import (
    JudgeExample,
    examples_from_groups,
    judge_histories,
    load_examples,
    train_judge,
    write_examples,
)
from benchmarks.judge_training import RUBRIC, labelled_groups
from environments.larger_number.task import rollout, scenarios


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
    with pytest.raises(ValueError, match=r"judge.jsonl:3: not a judge example"):
        load_examples(path)
    with pytest.raises(ValueError, match="2 labels for 3 attempts"):
        JudgeExample(message_lists=[[{"role": "user", "content": "x"}]] * 3, labels=[0.0, 1.0])


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


@pytest.mark.slow
async def test_a_judge_trained_beside_the_policy_changes_its_held_out_agreement_and_judges_a_step(served_model):
    judge = agentrl.TrainableModel(name="judge", project="tests", base_path=str(served_model.base_path))
    await judge.register(served_model.backend)
    # A short rubric keeps each demonstration short (SFT time); the judge is asked with the same one.
    judging = {"rubric": RUBRIC, "extra_litellm_params": {"max_tokens": 200, "temperature": 0.0}}
    settings = {"permutations": 1, "repeats": 0, **judging}
    held_out = labelled_groups("test", 8, seed=2)
    before = await agentrl.check_judge(held_out, judge, **settings)
    examples = examples_from_groups(labelled_groups("train", 24, seed=1), rubric=RUBRIC)
    result = await train_judge(judge, examples, agentrl.SFTConfig(epochs=4, batch_size=8, learning_rate=2e-3))
    assert result.step == 1 and await judge.get_step() == 1
    after = await agentrl.check_judge(held_out, judge, **settings)
    print(
        f"\ntrained judge, held-out pairwise accuracy {before.pairwise_accuracy.value:.2f} -> "
        f"{after.pairwise_accuracy.value:.2f}, mean score by position {before.position_mean_score} -> "
        f"{after.position_mean_score}, failed calls {before.failed_calls} -> {after.failed_calls} of {after.calls}"
    )
    # Greedy judging is deterministic, so whatever moved, the adapter moved it. (Measured here: the
    # untrained judge ties every pair, 0.50; benchmarks/judge_training.py follows it to 1.00.)
    judged_before = (before.pairwise_accuracy.value, before.position_mean_score, before.failed_calls)
    assert (after.pairwise_accuracy.value, after.position_mean_score, after.failed_calls) != judged_before
    assert after.failed_calls == 0, "the trained judge answers in RULER's format"

    policy = agentrl.TrainableModel(name="judged-policy", project="tests", base_path=str(served_model.base_path))
    await policy.register(served_model.backend)  # a fresh policy: its attempts still disagree
    groups = await agentrl.gather_trajectory_groups(
        [agentrl.TrajectoryGroup(rollout(policy, s) for _ in range(4)) for s in scenarios("train", 4, seed=31)],
        after_each=lambda g: agentrl.ruler_score_group(g, judge, audit=None, swallow_exceptions=True, **judging),
        show_progress=False,
    )
    assert await judge.get_step() == 1, "the judge's adapter stays where it was trained while it judges"
    step = await policy.train(groups, agentrl.TrainConfig(learning_rate=1e-5))
    assert not step.skipped and step.step == 1
