"""Judge checks: the statistics by hand, and judges of known quality behind a local HTTP server.

A judge that guesses must come out at chance, one that sees the truth near 1, and one that only
looks at the position must show its position bias and order sensitivity.
"""

import json
import math
import random

import pytest

import agentrl
from agentrl.judges.agreement import kendall_tau_b, pair_counts, pairwise_accuracy, rank_flip_rate
from agentrl.judges.check_report import recorded_groups, table, write_check
from agentrl.records.tracking import write_trajectories
from tests.fake_openai import FakeOpenAI
from tests.helpers import graded_groups


def test_pair_counts_and_tau_worked_by_hand():
    # reference orders all 3 pairs; the judge agrees on (0,1) and (0,2), swaps (1,2)
    assert pair_counts([1, 2, 3], [0.1, 0.9, 0.5]) == pair_counts([1, 2, 3], [0.1, 0.9, 0.5])
    counts = pair_counts([1, 2, 3], [0.1, 0.9, 0.5])
    assert (counts.credit, counts.pairs) == (2.0, 3)
    assert kendall_tau_b([1, 2, 3], [0.1, 0.9, 0.5]) == pytest.approx(1 / 3)
    # a reference tie is no pair; a judge tie is half credit
    counts = pair_counts([1, 1, 2], [0.5, 0.2, 0.5])
    assert (counts.credit, counts.pairs) == (1.5, 2)
    # tau-b with ties: C=1 (0,2)... worked out: pairs (0,1) ref tie, (0,2) judge tie, (1,2) concordant
    assert kendall_tau_b([1, 1, 2], [0.5, 0.2, 0.5]) == pytest.approx(1 / math.sqrt(2 * 2))
    assert kendall_tau_b([1, 1, 1], [0.1, 0.2, 0.3]) == 0.0
    assert rank_flip_rate([0.1, 0.5, 0.9], [0.9, 0.5, 0.1]) == 1.0
    assert rank_flip_rate([0.1, 0.5, 0.9], [0.2, 0.6, 0.7]) == 0.0


def test_pairwise_accuracy_interval_covers_the_value_and_narrows_with_more_groups():
    rng = random.Random(1)
    few = [pair_counts([1, 2, 3, 4], [rng.random() for _ in range(4)]) for _ in range(5)]
    many = [pair_counts([1, 2, 3, 4], [rng.random() for _ in range(4)]) for _ in range(200)]
    small, large = pairwise_accuracy(few), pairwise_accuracy(many)
    assert small.low <= small.value <= small.high and large.low <= large.value <= large.high
    assert large.high - large.low < small.high - small.low
    assert large.n == 200 * 6


@pytest.fixture
def fake():
    servers: list[FakeOpenAI] = []

    def make(mode: str) -> agentrl.Model:
        servers.append(FakeOpenAI(score_mode=mode))
        return agentrl.Model(name=f"{mode}-judge", base_url=servers[-1].base_url, api_key="test")

    yield make
    for server in servers:
        server.close()


async def test_a_judge_that_guesses_comes_out_at_chance(fake):
    report = await agentrl.check_judge(graded_groups(60), fake("random"), permutations=1, repeats=1)
    assert report.informative_groups == 60 and report.pairwise_accuracy.n == 360
    acc, tau = report.pairwise_accuracy, report.kendall_tau
    assert acc.low < 0.5 < acc.high and abs(acc.value - 0.5) < 0.1
    assert tau.low < 0.0 < tau.high
    assert report.repeat_identical_fraction == 0.0  # a guessing judge does not repeat itself
    assert report.order_rank_flip_rate > 0.3


async def test_a_judge_that_sees_the_truth_agrees_and_is_stable(fake):
    report = await agentrl.check_judge(graded_groups(20), fake("oracle"), permutations=2, repeats=1)
    assert report.pairwise_accuracy.value == 1.0 and report.kendall_tau.value == pytest.approx(1.0)
    assert report.pairwise_accuracy.low > 0.9
    assert report.order_score_change == 0.0 and report.order_rank_flip_rate == 0.0
    assert report.repeat_identical_fraction == 1.0 and report.repeat_score_change == 0.0
    assert abs(report.position_bias) < 0.15
    assert report.calls == 20 * 4 and report.failed_calls == 0
    assert report.prompt_tokens_per_group == 10 and report.usd_per_group is None  # the fake is unpriced


async def test_a_judge_that_reads_only_the_position_is_caught(fake):
    report = await agentrl.check_judge(graded_groups(20), fake("position"), permutations=3, repeats=0)
    assert report.position_mean_score[0] == 1.0 and report.position_mean_score[-1] == 0.0
    assert report.position_bias == pytest.approx(0.5)
    assert report.order_rank_flip_rate > 0.3 and report.order_score_change > 0.2
    assert report.pairwise_accuracy.low < 0.5 < report.pairwise_accuracy.high


async def test_failed_judge_calls_are_counted_not_scored():
    server = FakeOpenAI(score_mode="oracle")
    try:
        server.plan("500")
        judge = agentrl.Model(name="flaky", base_url=server.base_url, api_key="test")
        report = await agentrl.check_judge(graded_groups(3), judge, permutations=1, repeats=0, max_attempts=1)
    finally:
        server.close()
    assert (report.calls, report.failed_calls) == (6, 1)
    assert report.pairwise_accuracy.value == 1.0  # from the calls that answered; nothing filled in


async def test_a_check_from_a_run_folder_writes_json_and_a_page(tmp_path, fake):
    run_dir = tmp_path / "proj" / "run"
    groups = graded_groups(5)
    groups.append(
        agentrl.TrajectoryGroup(  # all equal: kept last, shows no agreement
            agentrl.Trajectory(reward=0.5, messages_and_choices=[{"role": "user", "content": "x"}]) for _ in range(3)
        )
    )
    write_trajectories(run_dir, 1, "train", groups[:3])
    write_trajectories(run_dir, 2, "train", groups[3:])
    loaded, per_step = recorded_groups(run_dir, max_groups=6)
    assert per_step == 3 and len(loaded) == 6
    assert {t.reward for t in loaded[-1].trajectories} == {0.5}
    report = await agentrl.check_judge(loaded, fake("oracle"), groups_per_step=per_step)
    assert report.groups == 6 and report.informative_groups == 5
    json_path, html_path = write_check(run_dir, [report])
    saved = json.loads(json_path.read_text())
    assert saved[0]["pairwise_accuracy"]["value"] == 1.0 and saved[0]["groups_per_step"] == 3
    assert "pairwise acc" in html_path.read_text() and "openai/oracle-judge at http" in table([report])
    with pytest.raises(agentrl.ConfigurationError, match="no recorded val trajectories"):
        recorded_groups(run_dir, split="val")
