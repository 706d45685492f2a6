"""The tool-use task with an agent from another framework, run as its own process through a rollout session.

    .venv/bin/python -m agentrl_environments.tool_use.frameworks --agent openai-agents|langgraph [--steps N]

Each rollout opens a session on the gateway (`model.session()`), starts the agent program
(`agents/openai_agents_program.py` or `agents/langgraph_program.py`) with the session's URL and key as
OPENAI_BASE_URL and OPENAI_API_KEY, and waits for it. Every completion the program asked for is the session's
trajectory, turn by turn on the engine's exact tokens; the task's strict or shaped reward is read from it
(`env.score`), whatever the program printed. Training is `agentrl train tools`'s own (`train.train_agent`):
demonstrations first (the packaged model opens no call on its own in "auto"), then RL, held-out evaluation
before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import sys

import agentrl

from ..training import RunSummary
from .env import PRESETS, REWARDS, score
from .task import Question
from .train import train_agent

PROGRAMS = {
    "openai-agents": "agentrl_environments.tool_use.agents.openai_agents_program",
    "langgraph": "agentrl_environments.tool_use.agents.langgraph_program",
}
PROGRAM_TIMEOUT_S = 600.0
PROGRAMS_AT_ONCE = 16
"""Programs running at once, in training and evaluation alike: each is a Python process of its own."""


@agentrl.limit_concurrency(PROGRAMS_AT_ONCE)
async def program_rollout(
    model: agentrl.TrainableModel,
    question: Question,
    *,
    agent: str,
    max_turns: int = 4,
    max_tokens: int = 64,
    reward: str = "shaped",
) -> agentrl.Trajectory:
    """One run of the `agent` program on `question`, in its own process, recorded by a rollout session."""
    split, index = question.question_id.rsplit("-", 1)
    async with model.session() as session:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", PROGRAMS[agent], session.model, split, index, str(max_turns), str(max_tokens),
            env={**os.environ, "OPENAI_BASE_URL": session.base_url, "OPENAI_API_KEY": session.api_key},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            _, errors = await asyncio.wait_for(process.communicate(), PROGRAM_TIMEOUT_S)
        except TimeoutError:
            process.kill()
            await process.wait()
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
    return await train_agent(
        functools.partial(program_rollout, agent=agent),
        preset_name=preset_name,
        steps=steps,
        base_model=None,
        name=name or f"tool-use-{agent}",
        base_path=base_path,
        reward=reward,
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
