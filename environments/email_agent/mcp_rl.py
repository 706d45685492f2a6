"""MCP-RL on the email inbox served over MCP: tasks written from the server's tools, RULER rewards,
and the held-out questions' known answers as a check no judge sets.

python -m agentrl_environments.email_agent.mcp_rl [--steps N] [--eval-tasks N] [--warm-start N] [--writer MODEL] [--judge MODEL]

Each rollout starts its own stdio server bound to one inbox (a session per rollout). Written tasks
are spread over the training inboxes; held-out tasks are the test split's questions, on inboxes
never trained on. The packaged 135M model calls no tool on its own; `--warm-start N` first trains
it on N demonstrations over the MCP tools (search, read, complete_task) from training inboxes, so
the held-out "before" is the warm-started model and before/after measures MCP-RL alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import zlib
from collections.abc import Callable
from typing import Any

import agentrl
from agentrl import JudgeModel
from agentrl.mcp import COMPLETE_TASK_TOOL, MCPRLConfig, MCPRLReport, MCPTask, MCPToolbox, StdioServer, train_mcp_rl

from .data import Question
from .env import EmailEnvironment, demonstration
from .grading import answer_is_correct

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
        args = ["-m", "agentrl_environments.email_agent.mcp_server", "--database", str(env.database), "--inbox", inbox]
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
    return float(bool(expected) and answer_is_correct(str(trajectory.metadata.get("final_answer", "")), str(expected)))


def mcp_demonstration(question: Question, env: EmailEnvironment, tools: list[dict[str, Any]]) -> agentrl.History:
    """The email environment's correct conversation (search, read the source, answer) retold over the
    MCP tools: the same tool results, the answer given through `complete_task`."""
    messages = [dict(m) for m in demonstration(question, env).messages()]
    messages[0] = {"role": "system", "content": SYSTEM_PROMPT}
    answer_call = messages[-2]["tool_calls"][0]
    summary = json.dumps({"summary": question.answer})
    messages[-2] = {
        **messages[-2],
        "tool_calls": [{**answer_call, "function": {"name": "complete_task", "arguments": summary}}],
    }
    messages[-1] = {**messages[-1], "content": "Task marked complete."}
    return agentrl.History(messages_and_choices=messages, tools=[*tools, COMPLETE_TASK_TOOL])


async def warm_start(model: agentrl.TrainableModel, env: EmailEnvironment, examples: int) -> dict[str, float]:
    """Supervised training on `examples` MCP demonstrations from the training inboxes."""
    questions = env.data.split("train")[:examples]
    async with MCPToolbox(
        servers_for(env)(MCPTask(task=questions[0].question, metadata={"inbox": questions[0].inbox}))
    ) as toolbox:
        tools = toolbox.tools
    result = await model.train_sft([mcp_demonstration(q, env, tools) for q in questions], agentrl.SFTConfig())
    return result.metrics


async def run(
    model: agentrl.TrainableModel,
    *,
    config: MCPRLConfig | None = None,
    writer: JudgeModel | None = None,
    judge: JudgeModel | None = None,
    warm_start_examples: int = 0,
) -> MCPRLReport:
    """Train a registered `model` with MCP-RL on the inbox server (after an optional warm start);
    returns held-out before/after."""
    env = EmailEnvironment.load()
    config = config or MCPRLConfig(system_prompt=SYSTEM_PROMPT, custom_instructions=CUSTOM_INSTRUCTIONS)
    if warm_start_examples:
        await warm_start(model, env, warm_start_examples)
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
    parser.add_argument("--warm-start", type=int, default=48, help="MCP demonstrations before RL (0: none)")
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
        report = await run(
            model, config=config, writer=args.writer, judge=args.judge, warm_start_examples=args.warm_start
        )
        print(report.summary())
    finally:
        await backend.close()


if __name__ == "__main__":
    asyncio.run(main())
