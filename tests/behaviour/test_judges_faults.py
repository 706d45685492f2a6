"""Judges against a local server that misbehaves on command: retries are bounded, no reward is invented."""

import pytest

import agentrl
from agentrl.judges import (
    JudgeLimiter,
    RubricTask,
    judge_rubrics,
    load_rubric_tasks,
    rubric_rollout,
    ruler,
    ruler_score_group,
)
from tests.helpers import group_of, make_choice

FAST = {"timeout": 1.0}  # litellm request timeout for the timeout case


async def test_ruler_scores_a_group_in_one_call_and_keeps_the_old_reward(fake, judge):
    fake.good_score = 0.75
    group = group_of("Go to Rome.", "Stay home.", "Rome, 3 days, train.", reward=0.2)
    judged = await ruler_score_group(group, judge, audit=None)  # no audit: one call
    assert len(fake.requests) == 1
    assert judged.rewards == [0.75, 0.75, 0.75]
    for t in judged.trajectories:
        assert t.metrics["independent_reward"] == 0.2 and t.metrics["ruler_score"] == 0.75
        assert t.logs[-1].startswith("RULER: judged trajectory_")
    assert group.rewards == [0.2, 0.2, 0.2]  # the input group is untouched
    schema = fake.requests[0]["response_format"]["json_schema"]["schema"]
    assert schema["required"] == ["trajectory_1", "trajectory_2", "trajectory_3"]
    assert schema["additionalProperties"] is False
    prompt = fake.requests[0]["messages"][1]["content"]
    assert prompt.count("Plan a trip.") == 1  # the shared context is given once
    assert "Rome, 3 days, train." in prompt


@pytest.mark.parametrize("bad", ["500", "malformed", "missing_one", "extra_one", "out_of_range", "timeout"])
async def test_a_bad_answer_is_retried_then_accepted(fake, judge, bad):
    fake.plan(bad)
    result = await ruler(
        [[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]], judge, extra_litellm_params=FAST
    )
    assert result.attempts == 2 and result.scores == [0.5, 0.5]


async def test_a_greedy_judges_retry_after_an_unusable_answer_samples_and_after_a_500_stays_greedy(fake, judge):
    fake.plan("500", "malformed")
    result = await ruler([[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]], judge)
    assert result.attempts == 3 and [r["temperature"] for r in fake.requests] == [0.0, 0.0, 0.7]


@pytest.mark.parametrize("bad", ["500", "malformed", "missing_one", "out_of_range"])
async def test_retries_are_bounded_and_end_in_a_judge_error(fake, judge, bad):
    fake.plan(*[bad] * 10)
    limiter = JudgeLimiter()
    with pytest.raises(agentrl.JudgeError, match="3 attempt"):
        await ruler_score_group(group_of("x", "y"), judge, limiter=limiter, max_attempts=3)
    assert len(fake.requests) == 3
    assert limiter.failures == 1 and limiter.attempts == 3


async def test_swallow_exceptions_empties_the_group_and_keeps_the_judge_error(fake, judge):
    fake.plan(*["500"] * 3)

    async def judge_group(group):
        return await ruler_score_group(group, judge, swallow_exceptions=True)

    async def rollout(answer: str, token_ids: list[int]) -> agentrl.Trajectory:
        choice = make_choice(token_ids, content=answer)
        return agentrl.Trajectory(messages_and_choices=[{"role": "user", "content": "q"}, choice])

    (kept,) = await agentrl.gather_trajectory_groups(
        [agentrl.TrajectoryGroup([rollout("a", [1, 2, 3]), rollout("b", [4, 5])])],
        after_each=judge_group,
        show_progress=False,
    )
    assert kept.trajectories == []  # no invented reward
    assert kept.exceptions[-1].type == "JudgeError" and "judge openai/judge" in kept.exceptions[-1].message
    assert kept.exceptions[-1].sampled_tokens == 5  # the token ledger's judge_failure row: what was dropped


async def test_a_score_a_hair_over_one_is_clamped_without_a_retry(fake, judge):
    fake.plan("slightly_over")
    result = await ruler([[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]], judge)
    assert result.scores == [1.0, 1.0] and result.attempts == 1


async def test_a_fenced_json_answer_is_read(fake, judge):
    fake.plan("fenced")
    result = await ruler([[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]], judge)
    assert result.attempts == 1


async def test_identical_trajectories_are_judged_once(fake, judge):
    judged = await ruler_score_group(group_of("same", "same", "same"), judge)
    assert len(fake.requests) == 1
    assert fake.requests[0]["response_format"]["json_schema"]["schema"]["required"] == ["trajectory_1"]
    assert len(judged.trajectories) == 3


async def test_concurrent_judge_calls_are_capped_by_a_shared_limiter(fake, judge):
    import asyncio

    fake.delay_s = 0.2
    limiter = JudgeLimiter(max_concurrent=2)
    groups = [group_of(f"a{i}", f"b{i}") for i in range(6)]
    await asyncio.gather(*(ruler_score_group(g, judge, limiter=limiter, audit=None) for g in groups))
    assert fake.max_in_flight <= 2
    assert limiter.calls == 6 and len(limiter.latencies_s) == 6


async def test_rubric_judge_checks_every_rubric_in_one_call(fake, judge):
    rubrics = ["States the total.", "Bolds the names.", "Is polite."]
    judgement = await judge_rubrics("Summarise the bill.", "The total is $40.", rubrics, judge)
    assert len(fake.requests) == 1
    assert [v.passed for v in judgement.verdicts] == [True, False, True]
    assert judgement.pass_rate == pytest.approx(2 / 3)
    assert [v.rubric for v in judgement.verdicts] == rubrics


async def test_a_failed_rubric_judgement_skips_the_rollout_and_is_counted(fake, judge):
    policy = agentrl.Model(name="policy", base_url=fake.base_url, api_key="test")
    task = RubricTask(task_id="t1", prompt="Write a haiku.", rubrics=["Has three lines.", "Mentions autumn."])
    # The first request is the policy's answer; the judge then fails three times.
    fake.plan("ok", "malformed", "malformed", "malformed")
    groups = await agentrl.gather_trajectory_groups(
        [agentrl.TrajectoryGroup([rubric_rollout(policy, task, judge, audit=None)])],
        max_exception_rate=1.0,
        show_progress=False,
    )
    assert groups[0].trajectories == []  # no reward of 0.0 was made up
    assert [e.type for e in groups[0].exceptions] == ["JudgeError"]
    # And when the judge works, the reward is the pass rate with per-rubric metrics.
    trajectory = await rubric_rollout(policy, task, judge, audit=None)
    assert trajectory.reward == 0.5 and trajectory.metrics == {"rubric_1_passed": 1.0, "rubric_2_passed": 0.0}


def test_rubric_tasks_load_from_jsonl_and_bad_lines_name_their_number(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"task_id": "a", "prompt": "p", "rubrics": ["r1", "r2"]}\n\n{"task_id": "b", "prompt": "p"}\n')
    with pytest.raises(agentrl.ConfigurationError, match=r"tasks.jsonl:3: .*rubrics"):
        load_rubric_tasks(path)
    path.write_text('{"task_id": "a", "prompt": "p", "rubrics": ["r1", "r2"]}\n')
    assert load_rubric_tasks(path)[0].rubrics == ["r1", "r2"]


@pytest.mark.parametrize("name", ["o3", "o4-mini", "gpt-5-mini"])
async def test_a_judge_that_takes_only_its_default_temperature_is_sent_none_and_ranks(fake, name):
    """ART's default RULER judge (openai/o3) and 2048's (openai/o4-mini): litellm refuses any temperature but 1
    before sending, so a judge call that always sent 0 never reached them. The fake speaks OpenAI's protocol."""
    fake.good_score = 0.75
    reasoning = agentrl.Model(name=name, base_url=fake.base_url, api_key="test")  # litellm sees openai/<name>
    judged = await ruler_score_group(group_of("a", "b"), reasoning, audit=None)
    assert judged.rewards == [0.75, 0.75] and "temperature" not in fake.requests[0]
    await judge_rubrics("q", "an answer", ["says yes"], reasoning)  # the rubric judge's call too
    assert len(fake.requests) == 2 and all("temperature" not in r for r in fake.requests)
    with pytest.raises(agentrl.ConfigurationError, match=rf"judge openai/{name} does not take temperature=0.2 .*leave"):
        await ruler_score_group(group_of("a", "b"), reasoning, extra_litellm_params={"temperature": 0.2})


async def test_art_ruler_with_its_default_judge_name_reaches_the_judge(fake, monkeypatch):
    """`art.rewards.ruler_score_group(group, "openai/o3", swallow_exceptions=True)` as ART's scripts call it, the
    provider's address pointed at the local stand-in: scored, not None (litellm refused every call before)."""
    from agentrl.art.rewards import ruler_score_group as art_ruler_score_group

    monkeypatch.setenv("OPENAI_API_KEY", "test")
    monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
    fake.good_score = 0.25
    judged = await art_ruler_score_group(group_of("a", "b"), "openai/o3", swallow_exceptions=True)
    assert judged is not None and judged.rewards == [0.25, 0.25] and "temperature" not in fake.requests[0]


async def test_art_ruler_logs_each_explanation_as_arts_does(fake, judge):
    from agentrl.art.rewards import ruler_score_group as art_ruler_score_group

    judged = await art_ruler_score_group(group_of("a", "b"), judge)
    assert all(t.logs[-1].startswith("RULER explanation: judged trajectory_") for t in judged.trajectories)
