"""Instruction following rewarded by a judge alone: one answer per task, graded on the task's rubrics.

The reward never comes from code. With `judge`, the rollout asks it about every rubric in one call
and the pass rate is the reward; without one, RULER ranks the finished group (`ruler_rewards`).
Where the task has code checks, their pass rate is kept as `metrics["independent_reward"]` only to
measure: it shows whether the judge's rising reward is real (`reward.png` flags steps where it is not).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import agentrl
from agentrl import AfterEach, JudgeModel
from agentrl.judges import DEFAULT_AUDIT, DEFAULT_RUBRIC, Readout, audit_rubrics

from ..training import DEFAULT_READOUT, judge_for
from .tasks import DATA, InstructionTask, checked_pass_rate

JUDGE_PARAMS = {"max_tokens": 768}
"""The judge writes a rationale per rubric; a small local judge needs room to finish its JSON."""


@dataclass(frozen=True)
class Preset:
    base_model: str
    max_tokens: int
    steps: int
    groups_per_step: int
    group_size: int
    learning_rate: float
    test_tasks: int
    test_samples: int = 1
    """Answers per held-out task: their mean per task makes the paired difference's noise smaller."""
    temperature: float = 1.0


PRESETS = {
    "cpu": Preset(
        "smollm2-135m-instruct",
        max_tokens=96,
        steps=40,
        groups_per_step=8,
        group_size=4,  # RULER reads a group of n by its n(n-1) ordered pairs: 4 keeps a judged step near a checked one
        learning_rate=5e-4,
        test_tasks=40,
        test_samples=3,
    ),
    "gpu": Preset(
        "Qwen/Qwen2.5-3B-Instruct",
        max_tokens=400,
        steps=60,
        groups_per_step=16,
        group_size=8,
        learning_rate=1e-5,
        test_tasks=60,
    ),
}


def load_tasks(path: str | Path | None = None, split: str = "train") -> list[InstructionTask]:
    """A user's JSONL file (task_id, prompt, rubrics; eval_rubrics and checks optional) or the shipped split."""
    return agentrl.load_rubric_tasks(path or DATA / f"{split}.jsonl", InstructionTask)


@agentrl.traced
async def rollout(
    model: agentrl.Model,
    task: InstructionTask,
    *,
    judge: JudgeModel | None = None,
    wording: str = "train",
    max_tokens: int = 96,
    temperature: float = 1.0,
    reward_from_checks: bool = False,
    readout: Readout = "json",
) -> agentrl.Trajectory:
    """Answer `task`; with `judge`, reward = its pass rate on the rubrics (`wording` "eval": the reworded
    ones). A judge that cannot answer raises JudgeError: the sample is skipped and counted, never scored.
    `reward_from_checks`: reward = the code-checked pass rate instead (the ceiling a judge is measured against).
    `readout="probabilities"`: each rubric asked alone, the pass rate the mean P(Yes) (a trained rubric judge's way)."""
    trajectory = agentrl.Trajectory(
        messages_and_choices=[{"role": "user", "content": task.prompt}], metadata={"task_id": task.task_id}
    )
    completion = await model.openai_client().chat.completions.create(
        model=model.inference_name,
        messages=cast(Any, trajectory.messages()),
        max_tokens=max_tokens,
        temperature=temperature,
    )
    choice = completion.choices[0]
    trajectory.messages_and_choices.append(choice)
    response = choice.message.content or ""
    checked = checked_pass_rate(task, response)
    if checked is not None:
        trajectory.metrics["independent_reward"] = checked
    if reward_from_checks:
        if checked is None:
            raise agentrl.ConfigurationError(
                f"task {task.task_id} has no code checks: reward 'checked' needs a check on some rubric of every task"
            )
        trajectory.reward = checked
        return trajectory
    if judge is None:  # RULER scores the group later; until then no reward exists
        return trajectory
    rubrics = task.eval_rubrics if wording == "eval" and task.eval_rubrics else task.rubrics
    judgement = await agentrl.judge_rubrics(
        task.prompt, response, rubrics, judge, extra_litellm_params=JUDGE_PARAMS, readout=readout
    )
    if readout == "json":  # a quarter of the answers judged again with the rubrics reordered: measured, never
        audit = await audit_rubrics(  # rewarded (read from probabilities, each rubric is asked alone: no order)
            task.prompt, response, judgement, judge, DEFAULT_AUDIT, extra_litellm_params=JUDGE_PARAMS
        )
        trajectory.metrics.update(audit)
    trajectory.reward = judgement.pass_rate
    trajectory.metrics["pass_rate"] = judgement.pass_rate
    for index, verdict in enumerate(judgement.verdicts, start=1):
        trajectory.metrics[f"rubric_{index}_passed"] = float(verdict.passed)
        trajectory.logs.append(f"rubric {index} ({'Yes' if verdict.passed else 'No'}): {verdict.rationale}")
    return trajectory


def task_rubric(task: InstructionTask) -> str:
    """The task's rubrics as one RULER rubric, a bullet each."""
    return "\n".join(f"- {r}" for r in task.rubrics)


def ruler_rewards(
    model: agentrl.TrainableModel,
    judge: JudgeModel | None,
    tasks: dict[str, InstructionTask],
    *,
    with_rubrics: bool,
    readout: Readout = DEFAULT_READOUT,
) -> AfterEach:
    """RULER ranks each finished group, given the task's rubrics as its rubric (`with_rubrics`) or its
    default rubric, reading the judge by `readout`. A group it cannot score is dropped and counted, never guessed."""

    async def score(group: agentrl.TrajectoryGroup) -> agentrl.TrajectoryGroup:
        task = tasks[str(group.trajectories[0].metadata["task_id"])] if group.trajectories else None
        rubric = task_rubric(task) if task and with_rubrics else DEFAULT_RUBRIC
        checked = [t.metrics.get("independent_reward") for t in group.trajectories]
        judged = await agentrl.ruler_score_group(
            group,
            judge_for(model, judge),
            rubric=rubric,
            swallow_exceptions=True,
            extra_litellm_params={"max_tokens": 1024},
            readout=readout,
        )
        for trajectory, independent in zip(judged.trajectories, checked):  # RULER keeps the old reward as
            if independent is None:  # independent_reward; with no code check there was none
                trajectory.metrics.pop("independent_reward", None)
            else:
                trajectory.metrics["independent_reward"] = independent
        return judged

    return score


async def evaluate(
    model: agentrl.Model, tasks: list[InstructionTask], judge: JudgeModel, preset: Preset
) -> list[agentrl.Trajectory]:
    """`preset.test_samples` answers per held-out task, graded with the reworded rubrics where the tasks have them."""
    return await agentrl.gather_trajectories(
        (
            rollout(model, t, judge=judge, wording="eval", max_tokens=preset.max_tokens, temperature=preset.temperature)
            for t in tasks
            for _ in range(preset.test_samples)
        ),
        max_exception_rate=0.5,  # a small judge fails some calls; counted, not scored (more than half: raise)
        desc=f"eval {model.inference_name}",
    )
