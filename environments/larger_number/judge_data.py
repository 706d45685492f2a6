"""Labelled judge examples from the larger-number check, made in any amount: no model samples them.

Each question is answered twice, once with the larger number (label 1) and once with the smaller
(label 0), which of the two comes first alternating; the judge is asked with `RUBRIC`. Train and
held-out examples come from the task's own split (`task.scenarios`): the held-out questions are pairs
of numbers the judge never trains on.
"""

from __future__ import annotations

import agentrl
from agentrl.judges.examples import JudgeExample, examples_from_groups

from .task import scenarios

RUBRIC = "- Score 1 for the larger of the two numbers, 0 for anything else."


def labelled_groups(split: str, count: int, *, seed: int) -> list[agentrl.TrajectoryGroup]:
    """`count` questions of `split`, each answered right (reward 1) and with the smaller number (reward 0)."""
    groups = []
    for index, scenario in enumerate(scenarios(split, count, seed=seed)):
        answers = [(str(scenario.answer), 1.0), (str(min(scenario.a, scenario.b)), 0.0)][:: 1 if index % 2 else -1]
        groups.append(
            agentrl.TrajectoryGroup(
                agentrl.Trajectory(
                    reward=label,
                    messages_and_choices=[
                        {"role": "user", "content": scenario.prompt},
                        {"role": "assistant", "content": answer},
                    ],
                )
                for answer, label in answers
            )
        )
    return groups


def judge_examples(split: str, count: int, *, seed: int = 1) -> list[JudgeExample]:
    """`count` labelled judge examples from `split` ("train" or "test")."""
    return examples_from_groups(
        labelled_groups(split, count, seed=seed), rubric=RUBRIC, source=f"larger-number {split}"
    )
