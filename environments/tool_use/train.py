"""Train the tool-use agent: warm-start tool use on demonstrations, then RL with tools offered in "auto".

.venv/bin/agentrl train tools [--preset cpu|gpu] [--steps N] [--model ...] [--reward shaped|strict]

Rewards: `shaped` (the default: 1 for a strict success, else partial credit for the needed calls made,
answering at all and calls that ran; `task.shaped_reward`) or `strict` (1 only when the answer states the
right number and this episode's call of the right tool returned it). Held-out evaluation is always strict.
"""

from __future__ import annotations

import agentrl

from ..training import RunSummary, evaluate_base_and_checkpoint, train_and_evaluate, with_overrides
from .env import PRESETS, REWARDS, AgentRollout, Preset, demonstration, evaluate, rollout
from .task import Question, questions


async def warm_start(model: agentrl.TrainableModel, train: list[Question], examples: int) -> None:
    """Supervised training on correct tool-using conversations (the kinds in turn), on a model at step 0."""
    result = await model.train_sft([demonstration(q) for q in train[:examples]], agentrl.SFTConfig())
    print(
        f"warm start: {examples} demonstrations -> step {result.step}, sft loss {result.metrics.get('sft_loss', 0):.3f}"
    )


def held_out_questions(preset: Preset) -> list[Question]:
    return questions("test", preset.test_questions)


async def run(
    preset_name: str = "cpu",
    steps: int | None = None,
    base_model: str | None = None,
    name: str = "tool-use",
    base_path: str = agentrl.DEFAULT_BASE_PATH,
    reward: str = "shaped",
    max_steps_off_policy: int | None = None,
) -> RunSummary:
    """Train this environment's own rollout (`env.rollout`)."""
    return await train_agent(
        rollout,
        preset_name=preset_name,
        steps=steps,
        base_model=base_model,
        name=name,
        base_path=base_path,
        reward=reward,
        max_steps_off_policy=max_steps_off_policy,
    )


async def train_agent(
    agent: AgentRollout,
    *,
    preset_name: str,
    steps: int | None,
    base_model: str | None,
    name: str,
    base_path: str,
    reward: str,
    max_steps_off_policy: int | None = None,
) -> RunSummary:
    """Warm start on demonstrations, then RL on `agent`'s rollouts, held-out strict success before and after."""
    if reward not in REWARDS:
        raise ValueError(f"unknown reward {reward!r}; choose one of: {', '.join(REWARDS)}")
    preset = with_overrides(PRESETS[preset_name], steps, base_model)
    train, test = questions("train", preset.train_questions), held_out_questions(preset)
    model = agentrl.TrainableModel(name=name, project="tool-use", base_model=preset.base_model, base_path=base_path)

    def make_group(model: agentrl.TrainableModel, question: Question) -> agentrl.TrajectoryGroup:
        return agentrl.TrajectoryGroup(
            agent(model, question, max_turns=preset.max_turns, max_tokens=preset.max_tokens, reward=reward)
            for _ in range(preset.group_size)
        )

    return await train_and_evaluate(
        model,
        # RL starts after the demonstrations' questions, so it never trains on a question it was shown.
        scenarios=train[preset.sft_examples :],
        groups_per_step=preset.groups_per_step,
        make_group=make_group,
        evaluate=lambda m: evaluate(m, test, preset, agent),
        steps=preset.steps,
        config=agentrl.TrainConfig(learning_rate=preset.learning_rate),
        warm_start=(lambda m: warm_start(m, train, preset.sft_examples)) if preset.sft_examples else None,
        max_steps_off_policy=max_steps_off_policy,
    )


async def evaluate_run(
    preset_name: str = "cpu", name: str = "tool-use", base_path: str = agentrl.DEFAULT_BASE_PATH
) -> dict[str, dict[str, float]]:
    preset = PRESETS[preset_name]
    model = agentrl.TrainableModel(name=name, project="tool-use", base_model=preset.base_model, base_path=base_path)
    return await evaluate_base_and_checkpoint(model, lambda m: evaluate(m, held_out_questions(preset), preset))


COMMANDS = agentrl.EnvironmentCommands(run=run, evaluate_run=evaluate_run, default_name="tool-use", rewards=REWARDS)
"""What `agentrl train|eval` finds through this package's "agentrl.environments" entry point."""
