"""The tool-use task with an agent from another framework, run as its own process through a rollout session.

    .venv/bin/python -m agentrl_environments.tool_use.frameworks --agent openai-agents|langgraph [--steps N]

Each rollout opens a session on the gateway (`model.session()`), starts the agent program
(`agents/openai_agents_program.py` or `agents/langgraph_program.py`) with the session's URL and key as
OPENAI_BASE_URL and OPENAI_API_KEY, and waits for it. Every completion the program asked for is the session's
trajectory, turn by turn on the engine's exact tokens; the task's strict or shaped reward is read from it
(`env.score`), whatever the program printed. Training is the same loop as `agentrl train tools`: demonstrations
first (the packaged model opens no call on its own in "auto"), then RL, held-out evaluation before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

import agentrl

from ..training import RunSummary, train_and_evaluate, with_overrides
from .env import PRESETS, REWARDS, score
from .task import Question, questions
from .train import held_out_questions, warm_start

PROGRAMS = {
    "openai-agents": "agentrl_environments.tool_use.agents.openai_agents_program",
    "langgraph": "agentrl_environments.tool_use.agents.langgraph_program",
}
PROGRAM_TIMEOUT_S = 600.0


async def program_rollout(
    model: agentrl.TrainableModel, question: Question, agent: str, *, reward: str = "shaped"
) -> agentrl.Trajectory:
    """One run of the `agent` program on `question`, in its own process, recorded by a rollout session."""
    split, index = question.question_id.rsplit("-", 1)
    async with model.session() as session:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", PROGRAMS[agent], session.model, split, index,
            env={**os.environ, "OPENAI_BASE_URL": session.base_url, "OPENAI_API_KEY": session.api_key},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            _, errors = await asyncio.wait_for(process.communicate(), PROGRAM_TIMEOUT_S)
        except TimeoutError:
            process.kill()
            raise
        if process.returncode != 0:
            raise RuntimeError(f"the {agent} program exited with {process.returncode}: {errors.decode()[-2000:]}")
    return score(session.trajectory, question, reward)


async def run(
    agent: str,
    preset_name: str = "cpu",
    steps: int | None = None,
    name: str | None = None,
    base_path: str = agentrl.DEFAULT_BASE_PATH,
    reward: str = "shaped",
) -> RunSummary:
    """Train the `agent` program on the tool-use task as `agentrl train tools` trains its own rollout."""
    preset = with_overrides(PRESETS[preset_name], steps, None)
    train, test = questions("train", preset.train_questions), held_out_questions(preset)
    model = agentrl.TrainableModel(
        name=name or f"tool-use-{agent}", project="tool-use", base_model=preset.base_model, base_path=base_path
    )
    limited = agentrl.limit_concurrency(16)(program_rollout)  # each program is a Python process of its own

    async def evaluate(m: agentrl.Model) -> list[agentrl.Trajectory]:
        assert isinstance(m, agentrl.TrainableModel)
        return await agentrl.gather_trajectories(
            (limited(m, q, agent, reward="strict") for q in test), max_exception_rate=0.1, desc=f"eval {agent}"
        )

    return await train_and_evaluate(
        model,
        scenarios=train[preset.sft_examples :],
        groups_per_step=preset.groups_per_step,
        make_group=lambda m, q: agentrl.TrajectoryGroup(
            limited(m, q, agent, reward=reward) for _ in range(preset.group_size)
        ),
        evaluate=evaluate,
        steps=preset.steps,
        config=agentrl.TrainConfig(learning_rate=preset.learning_rate),
        warm_start=(lambda m: warm_start(m, train, preset.sft_examples)) if preset.sft_examples else None,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agent", choices=sorted(PROGRAMS), required=True)
    parser.add_argument("--preset", default="cpu", choices=sorted(PRESETS))
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--reward", default="shaped", choices=REWARDS)
    args = parser.parse_args()
    summary = asyncio.run(run(args.agent, args.preset, args.steps, reward=args.reward))
    print(f"held-out strict success: {summary.before.get('success', 0):.3f} -> {summary.after.get('success', 0):.3f}")


if __name__ == "__main__":
    main()
