"""Train instruction following with a judge as the only reward.

.venv/bin/agentrl train rubric [--preset cpu|gpu] [--steps N] [--reward rubric|ruler|ruler-generic|checked] [--judge MODEL] [--tasks FILE]

Rewards: `rubric` (one judge call per answer checks all its rubrics; reward = pass rate), `ruler`
(RULER ranks each group, given the task's rubrics as its rubric), `ruler-generic` (RULER with its
default rubric: the judge sees only the task), `checked` (the code-checked pass rate itself: no judge in
training, the ceiling the judged rewards are measured against; every task needs a code check). The judge is a litellm model id, or by default the
untrained base model on the run's own server. Held-out evaluation grades each answer with the
rubrics reworded (`eval_rubrics`, where the task file has them), so the policy is not graded by the
exact prompt it trained against; the code-checked pass rate (`independent_reward`) is reported beside it.
`--tasks FILE`: your own JSONL (task_id, prompt, rubrics) trains instead; held-out is then its last fifth.
"""

from __future__ import annotations

import agentrl
from agentrl.judges import Readout

from ..training import (
    DEFAULT_READOUT,
    RunSummary,
    evaluate_base_and_checkpoint,
    judge_for,
    judge_option,
    train_and_evaluate,
    with_overrides,
)
from .env import PRESETS, evaluate, load_tasks, rollout, ruler_rewards
from .tasks import InstructionTask

REWARDS = ("rubric", "ruler", "ruler-generic", "checked")
JUDGED_REWARDS = REWARDS[:3]


def splits(tasks_file: str | None) -> tuple[list[InstructionTask], list[InstructionTask]]:
    """The shipped train/test files, or a user's file split 4:1 (in file order)."""
    if tasks_file is None:
        return load_tasks(split="train"), load_tasks(split="test")
    tasks = load_tasks(tasks_file)
    if len(tasks) < 2:
        raise ValueError(f"{tasks_file} holds {len(tasks)} task(s); it needs at least 2 (train and held-out)")
    cut = max(1, len(tasks) * 4 // 5)
    return tasks[:cut], tasks[cut:]


async def run(
    preset_name: str = "cpu",
    steps: int | None = None,
    base_model: str | None = None,
    name: str = "rubric",
    base_path: str = agentrl.DEFAULT_BASE_PATH,
    reward: str | None = None,
    judge: str | None = None,
    tasks: str | None = None,
    max_steps_off_policy: int | None = None,
    test_tasks: int | None = None,
    judge_readout: Readout = DEFAULT_READOUT,
) -> RunSummary:
    reward = reward or REWARDS[0]
    if reward not in REWARDS:
        raise ValueError(f"unknown reward {reward!r}; choose one of: {', '.join(REWARDS)}")
    preset = with_overrides(PRESETS[preset_name], steps, base_model)
    train, test = splits(tasks)
    test = test[: test_tasks or preset.test_tasks]
    by_id = {t.task_id: t for t in train}
    unchecked = [t.task_id for t in train if reward == "checked" and not any(t.checks or [])]
    if unchecked:
        raise agentrl.ConfigurationError(
            f"--reward checked: {len(unchecked)} training task(s) have no code check ({', '.join(unchecked[:3])}...); "
            "give every task a `checks` entry or train with --reward rubric or ruler"
        )
    model = agentrl.TrainableModel(name=name, project="rubric", base_model=preset.base_model, base_path=base_path)
    judge_model = judge_option(
        judge, base_path=base_path, base_model=preset.base_model, ruler=reward != "rubric", readout=judge_readout
    )
    # A trained judge rewards training only; held-out answers are graded as in every other run (the base model).
    grader = None if isinstance(judge_model, agentrl.TrainableModel) else judge_model

    async def held_out(m: agentrl.Model) -> list[agentrl.Trajectory]:
        return await evaluate(m, test, judge_for(model, grader), preset)

    def make_group(model: agentrl.TrainableModel, task: InstructionTask) -> agentrl.TrajectoryGroup:
        rubric_judge = judge_for(model, judge_model) if reward == "rubric" else None
        return agentrl.TrajectoryGroup(
            rollout(
                model,
                task,
                judge=rubric_judge,
                max_tokens=preset.max_tokens,
                temperature=preset.temperature,
                reward_from_checks=reward == "checked",
                readout=judge_readout,
            )
            for _ in range(preset.group_size)
        )

    print(
        f"reward: {reward}; judge: {judge or 'the base model, served locally'}; {len(train)} train, {len(test)} held-out tasks"
    )
    return await train_and_evaluate(
        model,
        scenarios=train,
        groups_per_step=preset.groups_per_step,
        make_group=make_group,
        evaluate=held_out,
        steps=preset.steps,
        config=agentrl.TrainConfig(learning_rate=preset.learning_rate),
        max_exception_rate=0.25,  # a small judge fails some calls: those samples are skipped and counted
        after_each=None
        if reward in ("rubric", "checked")
        else ruler_rewards(model, judge_model, by_id, with_rubrics=reward == "ruler", readout=judge_readout),
        max_steps_off_policy=max_steps_off_policy,
        judge=judge_model,
    )


async def evaluate_run(
    preset_name: str = "cpu", name: str = "rubric", base_path: str = agentrl.DEFAULT_BASE_PATH
) -> dict[str, dict[str, float]]:
    preset = PRESETS[preset_name]
    test = load_tasks(split="test")[: preset.test_tasks]
    model = agentrl.TrainableModel(name=name, project="rubric", base_model=preset.base_model, base_path=base_path)
    return await evaluate_base_and_checkpoint(model, lambda m: evaluate(m, test, judge_for(model, None), preset))


COMMANDS = agentrl.EnvironmentCommands(
    run=run,
    evaluate_run=evaluate_run,
    default_name="rubric",
    rewards=REWARDS,
    judged_rewards=JUDGED_REWARDS,
    takes_tasks=True,
)
"""What `agentrl train|eval` finds through this package's "agentrl.environments" entry point."""
