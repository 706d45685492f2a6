"""Train the email agent: measure tool use, warm-start with demonstrations if needed, then RL.

.venv/bin/agentrl train email [--preset cpu|gpu] [--steps N] [--model ...] [--reward match|judge|ruler]

Training rewards: `match` (the answer contains the fact, normalised), `judge` (an LLM judge decides
whether a free-text answer gives the fact; same shaping otherwise), `ruler` (RULER ranks each group;
the verifiable reward is kept as the `independent_reward` metric). The judge is a litellm model id
(`--judge openai/o4-mini`) or by default the untrained base model on the run's own server. Held-out
evaluation always uses `match`, so runs with different training rewards compare on one number.
"""

from __future__ import annotations

import agentrl
from agentrl import AfterEach, JudgeModel
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
from .data import Question
from .env import PRESETS, EmailEnvironment, demonstration, evaluate, rollout


async def warm_start(model: agentrl.TrainableModel, env: EmailEnvironment, examples: int) -> None:
    """Supervised training on correct tool-using conversations, on a registered model at step 0."""
    demos = [demonstration(q, env) for q in env.data.split("train")[:examples]]
    result = await model.train_sft(demos, agentrl.SFTConfig())
    print(
        f"warm start: {len(demos)} demonstrations -> step {result.step}, sft loss {result.metrics.get('sft_loss', 0):.3f}"
    )


REWARDS = ("match", "judge", "ruler")


def ruler_rewards(
    model: agentrl.TrainableModel, judge: JudgeModel | None, readout: Readout = DEFAULT_READOUT
) -> AfterEach:
    """Re-score each finished group with RULER, reading the judge by `readout`; a group the judge cannot
    score is dropped, not guessed."""

    async def score(group: agentrl.TrajectoryGroup) -> agentrl.TrajectoryGroup | None:
        return await agentrl.ruler_score_group(
            group,
            judge_for(model, judge),
            swallow_exceptions=True,
            extra_litellm_params={"max_tokens": 1024},
            readout=readout,
        )

    return score


async def run(
    preset_name: str = "cpu",
    steps: int | None = None,
    base_model: str | None = None,
    name: str = "email-agent",
    base_path: str = agentrl.DEFAULT_BASE_PATH,
    test_questions: int | None = None,
    reward: str = "match",
    judge: str | None = None,
    max_steps_off_policy: int | None = None,
    judge_readout: Readout = DEFAULT_READOUT,
) -> RunSummary:
    if reward not in REWARDS:
        raise ValueError(f"unknown reward {reward!r}; choose one of: {', '.join(REWARDS)}")
    preset = with_overrides(PRESETS[preset_name], steps, base_model)
    env = EmailEnvironment.load()
    train, test = env.data.split("train"), env.data.split("test")[:test_questions]
    model = agentrl.TrainableModel(name=name, project="email-agent", base_model=preset.base_model, base_path=base_path)
    judge_model = judge_option(
        judge, base_path=base_path, base_model=preset.base_model, ruler=reward == "ruler", readout=judge_readout
    )

    async def held_out(m: agentrl.Model) -> list[agentrl.Trajectory]:
        return await evaluate(m, test, env, preset)

    def make_group(model: agentrl.TrainableModel, question: Question) -> agentrl.TrajectoryGroup:
        return agentrl.TrajectoryGroup(
            rollout(
                model,
                question,
                env,
                max_turns=preset.max_turns,
                max_tokens=preset.max_tokens,
                judge=judge_for(model, judge_model) if reward == "judge" else None,
            )
            for _ in range(preset.group_size)
        )

    return await train_and_evaluate(
        model,
        scenarios=train,
        groups_per_step=preset.groups_per_step,
        make_group=make_group,
        evaluate=held_out,
        steps=preset.steps,
        config=agentrl.TrainConfig(learning_rate=preset.learning_rate),
        after_each=ruler_rewards(model, judge_model, judge_readout) if reward == "ruler" else None,
        warm_start=(lambda m: warm_start(m, env, preset.sft_examples)) if preset.sft_examples else None,
        max_steps_off_policy=max_steps_off_policy,
        judge=judge_model,
    )


async def evaluate_run(
    preset_name: str = "cpu", name: str = "email-agent", base_path: str = agentrl.DEFAULT_BASE_PATH
) -> dict[str, dict[str, float]]:
    preset = PRESETS[preset_name]
    env = EmailEnvironment.load()
    model = agentrl.TrainableModel(name=name, project="email-agent", base_model=preset.base_model, base_path=base_path)
    return await evaluate_base_and_checkpoint(model, lambda m: evaluate(m, env.data.split("test"), env, preset))


COMMANDS = agentrl.EnvironmentCommands(
    run=run, evaluate_run=evaluate_run, default_name="email-agent", rewards=REWARDS, judged_rewards=("judge", "ruler")
)
"""What `agentrl train|eval` finds through this package's "agentrl.environments" entry point."""
