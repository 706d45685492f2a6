"""MCP-RL on the email inbox served over MCP: tasks written from the server's tools, RULER rewards,
and the held-out questions' known answers as a check no judge sets.

python -m environments.email_agent.mcp_rl [--steps N] [--eval-tasks N] [--writer MODEL] [--judge MODEL]

Each rollout starts its own stdio server bound to one inbox (a session per rollout). Written tasks
are spread over the training inboxes; held-out tasks are the test split's questions, on inboxes
never trained on.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING

import agentrl
from agentrl.mcp import MCPRLConfig, MCPRLReport, MCPTask, StdioServer, train_mcp_rl
from environments.email_agent.data import Question
from environments.email_agent.env import EmailEnvironment, answer_is_correct

if TYPE_CHECKING:
    from agentrl.judges.call import JudgeModel

SYSTEM_PROMPT = (
    "You are an email assistant with tools to search and read the user's inbox. Do the user's task with "
    "the tools, then call complete_task with the answer."
)
CUSTOM_INSTRUCTIONS = (
    "The inbox holds work email: meeting moves, invoices, flights, decisions. Ask about facts an email could hold."
)


def servers_for(env: EmailEnvironment) -> Callable[[MCPTask], list[StdioServer]]:
    """A callable giving each task a stdio server bound to its inbox (written tasks: a training inbox by hash)."""
    train_inboxes = sorted({q.inbox for q in env.data.split("train")})

    def servers(task: MCPTask) -> list[StdioServer]:
        inbox = task.metadata.get("inbox") or train_inboxes[zlib.crc32(task.task.encode()) % len(train_inboxes)]
        args = ["-m", "environments.email_agent.mcp_server", "--database", str(env.database), "--inbox", inbox]
        return [StdioServer(command=sys.executable, args=args, name="inbox")]

    return servers


def held_out_tasks(env: EmailEnvironment, count: int) -> list[MCPTask]:
    """The first `count` test-split questions, one per inbox in turn, with their inbox and answer."""
    by_inbox: dict[str, list[Question]] = {}
    for question in env.data.split("test"):
        by_inbox.setdefault(question.inbox, []).append(question)
    ordered = [q for round_ in zip(*by_inbox.values(), strict=False) for q in round_]
    return [
        MCPTask(task=q.question, metadata={"inbox": q.inbox, "answer": q.answer, "question_id": q.question_id})
        for q in ordered[:count]
    ]


def answer_check(task: MCPTask, trajectory: agentrl.Trajectory) -> float:
    """1.0 when the final answer holds the question's fact; written tasks have no answer to check (0.0)."""
    expected = task.metadata.get("answer")
    return float(bool(expected) and answer_is_correct(str(trajectory.metadata.get("final_answer", "")), expected))


async def run(
    model: agentrl.TrainableModel,
    *,
    config: MCPRLConfig | None = None,
    writer: JudgeModel | None = None,
    judge: JudgeModel | None = None,
) -> MCPRLReport:
    """Train a registered `model` with MCP-RL on the inbox server; returns held-out before/after."""
    env = EmailEnvironment.load()
    config = config or MCPRLConfig(system_prompt=SYSTEM_PROMPT, custom_instructions=CUSTOM_INSTRUCTIONS)
    return await train_mcp_rl(
        model,
        servers_for(env),
        config=config,
        writer=writer,
        judge=judge,
        eval_tasks=held_out_tasks(env, config.num_eval_tasks),
        check=answer_check,
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--eval-tasks", type=int, default=20)
    parser.add_argument("--writer", default=None, help="litellm id of the task writer (default: the base model)")
    parser.add_argument("--judge", default=None, help="litellm id of the RULER judge (default: the base model)")
    parser.add_argument("--name", default="email-mcp-rl")
    args = parser.parse_args()
    model = agentrl.TrainableModel(name=args.name, project="email-mcp", base_model="smollm2-135m-instruct")
    backend = agentrl.LocalBackend()
    try:
        await model.register(backend)
        config = MCPRLConfig(
            steps=args.steps,
            num_eval_tasks=args.eval_tasks,
            system_prompt=SYSTEM_PROMPT,
            custom_instructions=CUSTOM_INSTRUCTIONS,
        )
        report = await run(model, config=config, writer=args.writer, judge=args.judge)
        print(report.summary())
    finally:
        await backend.close()


if __name__ == "__main__":
    asyncio.run(main())
