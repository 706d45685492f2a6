"""The judge audit and debiased RULER against fake judges at the HTTP boundary whose faults are planted:
a pure position bias, and an oracle that reverses a known fraction of its judgements."""

import json
import statistics

import pytest

import agentrl
from agentrl.judges import ruler_score_group
from agentrl.judges.agreement import rank_flip_rate
from agentrl.judges.audit import JudgeAudit, audit_judgements
from agentrl.records.judge_warning import judge_figures
from agentrl.records.step_metrics import step_line

GROUP_SIZE = 4


def graded_group(index: int) -> agentrl.TrajectoryGroup:
    """Attempts of known quality (in their text, for the oracle), the same as their own reward."""
    qualities = [0.1, 0.4, 0.7, 0.9]
    return agentrl.TrajectoryGroup(
        agentrl.Trajectory(
            reward=quality,
            messages_and_choices=[
                {"role": "user", "content": f"Task {index}."},
                {"role": "assistant", "content": f"Attempt {k}, quality={quality}."},
            ],
        )
        for k, quality in enumerate(qualities)
    )


def audit_means(groups: list[agentrl.TrajectoryGroup]) -> dict[str, float]:
    audited = [g.metrics for g in groups if "judge_audited" in g.metrics]  # a group's judgement: the group's figures
    assert not any(k.startswith("judge_") for g in groups for t in g.trajectories for k in t.metrics)
    assert audited, "no group was audited"
    return {key: statistics.fmean(m[key] for m in audited) for key in audited[0] if key.startswith("judge_")}


def test_the_audit_statistics_on_planted_judgements():
    scores_G = [1.0, 2 / 3, 1 / 3, 0.0]  # a judge that scores by position only, shown in order
    order = [2, 0, 3, 1]  # shown: trajectory 2 first
    result = audit_judgements(scores_G, order, [1.0, 2 / 3, 1 / 3, 0.0], independent_G=[0.1, 0.4, 0.7, 0.9])
    aligned_G = [2 / 3, 0.0, 1.0, 1 / 3]
    assert result.flip_rate == rank_flip_rate(scores_G, aligned_G)
    assert result.first_position_rate == 1.0 and result.first_position_chance == 0.25
    assert result.independent_tau == -1.0  # position order is the reverse of the planted quality
    honest = audit_judgements([0.1, 0.4, 0.7, 0.9], order, [0.7, 0.1, 0.9, 0.4], independent_G=[1, 2, 3, 4])
    assert honest.flip_rate == 0.0 and honest.self_consistency == 1.0 and honest.independent_tau == 1.0
    assert honest.first_position_rate == 0.0


async def test_a_position_biased_judge_is_caught_and_the_rewards_are_not_changed(fake, judge):
    fake.score_mode = "position"
    groups = [graded_group(i) for i in range(12)]
    audit = JudgeAudit(fraction=1.0, seed=1)
    judged = [await ruler_score_group(g, judge, audit=audit) for g in groups]
    plain = [await ruler_score_group(g, judge, audit=None) for g in groups]
    assert [g.rewards for g in judged] == [g.rewards for g in plain], "the audit never changes a reward"
    means = audit_means(judged)
    expected_flips = statistics.fmean(
        rank_flip_rate([1.0, 2 / 3, 1 / 3, 0.0], [1 - audit.order(_key(g), GROUP_SIZE).index(t) / 3 for t in range(4)])
        for g in groups
    )
    assert means["judge_flip_rate"] == pytest.approx(expected_flips) and means["judge_flip_rate"] > 0.3
    assert means["judge_first_position_rate"] == 1.0 and means["judge_first_position_chance"] == 0.25
    assert means["judge_independent_tau"] == -1.0  # it ranks by position, the reverse of the true order here
    assert all(g.metrics["judge_audit_tokens"] > 0 for g in judged)
    assert len(fake.requests) == 2 * len(groups) + len(groups)
    line = step_line({}, judged, skipped=None)  # each group's figures once, their mean over the step's groups
    assert line["group/judge_flip_rate"] == pytest.approx(expected_flips) and "judge_flip_rate" not in line
    assert judge_figures(line)["judge_tokens"] == statistics.fmean(g.metrics["judge_tokens"] for g in judged)


async def test_a_judge_reversed_a_quarter_of_the_time_shows_that_noise(fake, judge):
    fake.score_mode, fake.reverse_rate = "flaky", 0.25
    groups = [graded_group(i) for i in range(160)]
    judged = [await ruler_score_group(g, judge, audit=JudgeAudit(fraction=1.0, seed=2)) for g in groups]
    means = audit_means(judged)
    # Two judgements disagree on every pair when exactly one of them is reversed: 2p(1-p) = 0.375;
    # the judge agrees with the truth as (1-p) - p = 0.5 in expectation. 160 groups: SE about 0.04.
    assert means["judge_flip_rate"] == pytest.approx(0.375, abs=0.12)
    assert means["judge_independent_tau"] == pytest.approx(0.5, abs=0.24)
    assert means["judge_self_consistency"] == pytest.approx(1 - 2 * 0.375, abs=0.24)


async def test_only_a_fraction_of_groups_is_audited_and_at_its_cost(fake, judge):
    fake.score_mode = "oracle"
    groups = [graded_group(i) for i in range(40)]
    judged = [await ruler_score_group(g, judge, audit=JudgeAudit(fraction=0.25, seed=3)) for g in groups]
    audited = sum("judge_audited" in g.metrics for g in judged)
    assert 3 <= audited <= 18 and len(fake.requests) == len(groups) + audited
    means = audit_means(judged)
    assert means["judge_flip_rate"] == 0.0 and means["judge_independent_tau"] == 1.0
    assert all(g.metrics["judge_tokens"] > 0 for g in judged)


async def test_debiased_ruler_spreads_a_position_bias_over_the_group(fake, judge):
    fake.score_mode = "position"
    groups = [graded_group(i) for i in range(10)]
    plain = [await ruler_score_group(g, judge, audit=None) for g in groups]
    debiased = [
        await ruler_score_group(g, judge, audit=JudgeAudit(fraction=0.0, seed=4), permutations=6) for g in groups
    ]
    assert all(g.rewards[0] == 1.0 for g in plain), "plain RULER: the first shown always wins"
    first_mean = statistics.fmean(g.rewards[0] for g in debiased)
    assert 0.25 <= first_mean <= 0.75, first_mean
    assert len(fake.requests) == len(groups) + 6 * len(groups)
    with pytest.raises(agentrl.ConfigurationError, match="permutations"):
        await ruler_score_group(groups[0], judge, permutations=0)


def _key(group: agentrl.TrajectoryGroup) -> str:
    return json.dumps([t.messages() for t in group.trajectories], sort_keys=True, default=str)


async def test_a_rubric_judge_that_answers_by_position_flips_its_verdicts_when_the_rubrics_move(fake, judge):
    from agentrl.judges import judge_rubrics
    from agentrl.judges.rubric import audit_rubrics

    rubrics = ["States the total.", "Bolds the names.", "Is polite.", "Ends with a question."]
    audit = JudgeAudit(fraction=1.0, seed=5)
    judgement = await judge_rubrics("Summarise the bill.", "The total is $40.", rubrics, judge)
    assert [v.passed for v in judgement.verdicts] == [True, False, True, False]  # the fake: Yes at positions 1, 3
    metrics = await audit_rubrics("Summarise the bill.", "The total is $40.", judgement, judge, audit)
    order = audit.order(json.dumps(["Summarise the bill.", "The total is $40.", rubrics]), len(rubrics))
    planted = [(shown % 2 == 0) != (i % 2 == 0) for shown, i in enumerate(order)]  # moved to the other parity
    assert metrics == {"judge_audited": 1.0, "judge_flip_rate": sum(planted) / len(planted)}
    fake.verdict = "Yes"  # a judge whose verdicts do not depend on where a rubric stands
    steady = await judge_rubrics("Summarise the bill.", "The total is $40.", rubrics, judge)
    again = await audit_rubrics("Summarise the bill.", "The total is $40.", steady, judge, audit)
    assert again["judge_flip_rate"] == 0.0
    assert await audit_rubrics("x", "y", steady, judge, JudgeAudit(fraction=0.0)) == {}


@pytest.mark.parametrize("level", ["group/", ""], ids=["ruler-per-group", "rubric-per-trajectory"])
def test_an_audited_run_warns_about_a_judge_at_chance_plots_it_and_show_prints_it(tmp_path, caplog, level):
    from typer.testing import CliRunner

    from agentrl.cli import app
    from agentrl.records.tracking import read_metrics, record_step

    run = tmp_path / "demo" / "judged"
    fair = {"judge_flip_rate": 0.05, "judge_first_position_rate": 0.25, "judge_first_position_chance": 0.25,
            "judge_self_consistency": 0.9, "judge_independent_tau": 0.6}  # fmt: skip
    noisy = {**fair, "judge_flip_rate": 0.55, "judge_first_position_rate": 0.9, "judge_independent_tau": -0.1}
    line = lambda figures: {f"{level}{k}": v for k, v in {"judge_audited": 1.0, **figures}.items()}  # noqa: E731
    with caplog.at_level("WARNING", logger="agentrl.records.tracking"):
        record_step(run, 1, "train", [], {"reward_mean": 0.5, **line(fair)})
        record_step(run, 2, "train", [], {"reward_mean": 0.6, **line(noisy)})
    warned = [r.message for r in caplog.records if r.name == "agentrl.records.tracking"]
    assert len(warned) == 1 and warned[0].startswith("step 2: the judge looks no better than chance")
    assert "55% of pairs" in warned[0] and "shown first wins 90%" in warned[0] and "tau -0.10" in warned[0]
    assert [r[f"{level}judge_flip_rate"] for r in read_metrics(run)] == [0.05, 0.55]
    png = (run / "judge.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    shown = CliRunner().invoke(app, ["show", "demo/judged", "--base-path", str(tmp_path)])
    assert shown.exit_code == 0 and "flips" in shown.output and "0.55" in shown.output and "judge.png" in shown.output
