"""The task: "Which number is larger, a or b?", answered with a number. Verifiable, with a held-out split.

The packaged 135M model answers it right about a quarter of the time at temperature 1 (its first
number is often neither of the two), so groups of 8 attempts usually disagree: a learning signal.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import agentrl

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam


@dataclass(frozen=True)
class Scenario:
    a: int
    b: int

    @property
    def answer(self) -> int:
        return max(self.a, self.b)

    @property
    def prompt(self) -> str:
        return f"Which number is larger, {self.a} or {self.b}? Reply with only the number."


def _is_test(a: int, b: int) -> bool:
    # A fixed fifth of all pairs is held out; the split never depends on a seed.
    return (7 * a + 13 * b) % 5 == 0


def scenarios(split: str, count: int, *, seed: int = 0) -> list[Scenario]:
    """`count` distinct pairs of two-digit numbers from the "train" or "test" split; training pairs
    alternate larger-first and larger-second."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    pairs = [(a, b) for a in range(10, 100) for b in range(10, 100) if a != b and _is_test(a, b) == (split == "test")]
    if split == "test":
        return [Scenario(a, b) for a, b in random.Random(seed).sample(pairs, count)]
    # Training alternates which position holds the larger number, so no step's groups favour one: a batch
    # that happens to ask mostly "larger first" teaches "answer the first number", a policy that scores 0.5
    # and that its zero-variance groups give no way out of (the main job fell into it, 2026-11-28).
    smaller_first = random.Random(seed).sample([(a, b) for a, b in pairs if a < b], count)
    return [Scenario(b, a) if index % 2 == 0 else Scenario(a, b) for index, (a, b) in enumerate(smaller_first)]


def reward(response: str, scenario: Scenario) -> float:
    """1 if the first number in the response is the larger one, else 0."""
    numbers = re.findall(r"\d+", response)
    return float(bool(numbers) and int(numbers[0]) == scenario.answer)


@agentrl.traced
async def rollout(model: agentrl.Model, scenario: Scenario) -> agentrl.Trajectory:
    """One attempt: ask, read the answer, score it."""
    client = model.openai_client()
    trajectory = agentrl.Trajectory(
        messages_and_choices=[{"role": "user", "content": scenario.prompt}],
        metadata={"a": scenario.a, "b": scenario.b},
    )
    completion = await client.chat.completions.create(
        model=model.inference_name,
        messages=cast("list[ChatCompletionMessageParam]", trajectory.messages()),
        max_tokens=16,
        temperature=1.0,
    )
    choice = completion.choices[0]
    trajectory.messages_and_choices.append(choice)
    trajectory.reward = reward(choice.message.content or "", scenario)
    trajectory.metrics["completion_tokens"] = len(choice.logprobs.content or []) if choice.logprobs else 0
    return trajectory


async def evaluate(
    model: agentrl.Model, test_scenarios: list[Scenario], *, samples: int = 2
) -> list[agentrl.Trajectory]:
    """`samples` attempts at each held-out scenario, at the training temperature.

    Their mean reward estimates the policy's expected reward, the quantity RL optimises; with 128
    scenarios x 2 samples its standard error is about 0.03.
    """
    return await agentrl.gather_trajectories(
        (rollout(model, s) for s in test_scenarios for _ in range(samples)), desc=f"eval {model.inference_name}"
    )
