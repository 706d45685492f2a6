"""Both judges against the project's own vLLM server, the packaged model judging through litellm's
hosted-vLLM route. The 135M model is a weak judge: these test the plumbing (constrained decoding
to the schema, parsing, validation), not its taste."""

import math

from agentrl.judges import JudgeLimiter, judge_rubrics, ruler_score_group
from tests.test_judges_faults import group_of


async def test_ruler_with_the_packaged_model_as_judge(served_model):
    assert served_model.litellm_params()["model"].startswith("hosted_vllm/")
    group = group_of("Rome, three days, by train.", "I don't know.", "Paris.", reward=0.1)
    limiter = JudgeLimiter()
    judged = await ruler_score_group(group, served_model, limiter=limiter, extra_litellm_params={"max_tokens": 300})
    assert judged is not None and len(judged.trajectories) == 3
    for t in judged.trajectories:
        assert 0.0 <= t.reward <= 1.0 and math.isfinite(t.reward)
        assert t.metrics["independent_reward"] == 0.1
        assert t.logs[-1].startswith("RULER: ")
    print(f"\nRULER scores from the packaged judge: {judged.rewards}, attempts {limiter.attempts}")


async def test_rubric_judge_with_the_packaged_model(served_model):
    rubrics = ["The response names a city.", "The response mentions a number of days."]
    judgement = await judge_rubrics(
        "Plan a short trip.",
        "Visit Rome for three days.",
        rubrics,
        served_model,
        extra_litellm_params={"max_tokens": 300},
    )
    assert [v.rubric for v in judgement.verdicts] == rubrics
    assert judgement.pass_rate in (0.0, 0.5, 1.0)
    print(f"\nrubric verdicts from the packaged judge: {[v.passed for v in judgement.verdicts]}")
