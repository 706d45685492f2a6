"""Both judges against the project's own vLLM server, the packaged model judging through litellm's
hosted-vLLM route. The 135M model is a weak judge: these test the plumbing (constrained decoding
to the schema, parsing, validation), not its taste."""

import math

import pytest

from agentrl.judges import JudgeLimiter, judge_rubrics, ruler_score_group
from tests.helpers import group_of


@pytest.fixture
def base_judge(served_model):
    """The untrained base model, which the server always serves as "base": the session's adapter has
    been trained by earlier tests (SFT on email demonstrations among them) and is no fixed judge."""
    return served_model.backend.base_model()


async def test_ruler_with_the_packaged_model_as_judge(served_model, base_judge):
    assert served_model.litellm_params()["model"].startswith("hosted_vllm/")  # a trainable model judges the same way
    assert base_judge.litellm_params()["model"] == "hosted_vllm/base"
    group = group_of("Rome, three days, by train.", "I don't know.", "Paris.", reward=0.1)
    limiter = JudgeLimiter()
    judged = await ruler_score_group(group, base_judge, limiter=limiter, extra_litellm_params={"max_tokens": 600})
    assert judged is not None and len(judged.trajectories) == 3
    for t in judged.trajectories:
        assert 0.0 <= t.reward <= 1.0 and math.isfinite(t.reward)
        assert t.metrics["independent_reward"] == 0.1
        assert t.logs[-1].startswith("RULER: ")
    print(f"\nRULER scores from the packaged judge: {judged.rewards}, attempts {limiter.attempts}")


async def test_rubric_judge_with_the_packaged_model(base_judge):
    rubrics = ["The response names a city.", "The response mentions a number of days."]
    judgement = await judge_rubrics(
        "Plan a short trip.",
        "Visit Rome for three days.",
        rubrics,
        base_judge,
        extra_litellm_params={"max_tokens": 600},
    )
    assert [v.rubric for v in judgement.verdicts] == rubrics
    assert judgement.pass_rate in (0.0, 0.5, 1.0)
    print(f"\nrubric verdicts from the packaged judge: {[v.passed for v in judgement.verdicts]}")
