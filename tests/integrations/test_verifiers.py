"""A verifiers environment, built with verifiers' own classes, trains on agentrl.

Fast tier: its dataset becomes scenarios. Slow tier: the environment's own rollout runs against
the packaged model through the gateway, its rubric scores the group, and the group trains a step
on the exact sampled tokens.
"""

from __future__ import annotations

import re

import pytest

import agentrl
from tests.helpers import assert_trains_on_exact_tokens

vf = pytest.importorskip("verifiers")
datasets = pytest.importorskip("datasets")
from agentrl.integrations.verifiers import load_environment, scenarios, verifiers_group  # noqa: E402


def above_seven(completion, answer, **kwargs) -> float:  # noqa: ANN001  verifiers passes what a function names
    text = completion[-1]["content"] if isinstance(completion, list) else str(completion)
    numbers = [float(n) for n in re.findall(r"-?\d+(?:\.\d+)?", text or "")]
    return 1.0 if numbers and numbers[0] > float(answer) else 0.0


def number_environment() -> vf.Environment:
    rows = [{"question": f"Reply with one number larger than {n}.", "answer": str(n)} for n in (7, 20, 100)]
    return vf.SingleTurnEnv(
        dataset=datasets.Dataset.from_list(rows),
        system_prompt="Answer with a number only.",
        rubric=vf.Rubric(funcs=[above_seven]),
    )


def test_a_verifiers_dataset_becomes_scenarios():
    env = load_environment(number_environment())
    examples = scenarios(env)
    assert len(examples) == 3 and examples[0]["answer"] == "7"
    assert examples[0]["prompt"][-1] == {"role": "user", "content": "Reply with one number larger than 7."}
    with pytest.raises(agentrl.ConfigurationError, match="split"):
        scenarios(env, split="test")
    with pytest.raises(agentrl.ConfigurationError, match="verifiers Environment"):
        load_environment(42)  # type: ignore[arg-type]


@pytest.mark.slow
async def test_a_verifiers_environment_trains_a_step_on_exact_tokens(served_model):
    env = number_environment()
    example = scenarios(env)[0]
    group = await verifiers_group(served_model, env, example, group_size=4, sampling_args={"max_tokens": 12})
    assert len(group.trajectories) == 4
    for trajectory in group.trajectories:
        assert trajectory.messages()[0] == {"role": "system", "content": "Answer with a number only."}
        assert trajectory.reward in (0.0, 1.0) and trajectory.metrics["vf_above_seven"] == trajectory.reward
    trajectories = list(group.trajectories)
    if len({t.reward for t in trajectories}) == 1:  # the rubric gave every attempt the same score
        trajectories[0].reward += 0.5  # so the step has a gradient to train; the rubric's scores are above
    await assert_trains_on_exact_tokens(served_model, trajectories)
