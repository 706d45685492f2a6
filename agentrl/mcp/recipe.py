"""MCP-RL: train an agent on any MCP server with tasks an LLM writes from its tools and RULER rewards.

A recipe on the one agent loop (`run_agent`) and agentrl's one training loop (`train_pipelined`), not a
second loop: write tasks (or take the user's), then per step run a group of attempts per task, let RULER
rank each group, and train. Held-out tasks are attempted before and after; RULER then judges each
task's before/after pair side by side, which gives a score the two can be compared on, and a
`check` (an answer the rollout can verify) gives a score that no judge sets.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl.client.gather import gather_trajectories, gather_trajectory_groups
from agentrl.client.model import JudgeModel, TrainableModel
from agentrl.client.pipeline import train_pipelined
from agentrl.data.trajectory import Trajectory
from agentrl.data.trajectory_group import TrajectoryGroup
from agentrl.foundation.config import TrainConfig
from agentrl.foundation.errors import ConfigurationError
from agentrl.foundation.files import write_text_atomic
from agentrl.judges.ruler_group import ruler_score_group
from agentrl.mcp.agent import run_agent
from agentrl.mcp.servers import MCPToolbox, ServerSpec
from agentrl.mcp.tasks import MCPTask, generate_tasks, tasks_to_jsonl

DEFAULT_SYSTEM_PROMPT = (
    "You are an assistant with tools. Use them to do the user's task, then call complete_task with a short "
    "summary of the result."
)
Check = Callable[[MCPTask, Trajectory], float | Awaitable[float]]
"""A verifiable score of one attempt (1.0 = right), independent of any judge."""
Servers = Sequence[ServerSpec] | Callable[[MCPTask], Sequence[ServerSpec]]
"""The servers every rollout uses, or the servers for one task (then each rollout opens its own)."""


@dataclass
class MCPRLConfig:
    """How much to train, and how each attempt runs."""

    steps: int = 2
    tasks_per_step: int = 2
    group_size: int = 4
    num_eval_tasks: int = 8
    max_turns: int = 4
    max_tokens: int = 128
    learning_rate: float = 5e-5
    tool_timeout_s: float = 30.0
    shared_session: bool = True
    """With a fixed server list: one connection for all rollouts (True) or one per rollout (False)."""
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    custom_instructions: str | None = None
    """Added to the task writer's prompt (what kind of tasks, which data exists)."""


@dataclass(frozen=True)
class Score:
    """A mean over held-out tasks and its standard error."""

    mean: float
    sem: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Score:
        n = len(values)
        if n == 0:
            return cls(math.nan, math.nan, 0)
        mean = sum(values) / n
        variance = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else math.nan
        return cls(mean, math.sqrt(variance / n) if n > 1 else math.nan, n)

    def __str__(self) -> str:
        return f"{self.mean:.3f} ± {self.sem:.3f} (n={self.n})"


@dataclass
class MCPRLReport:
    """What an MCP-RL run did: its tasks, each step's metrics, and held-out scores before and after."""

    train_tasks: list[MCPTask]
    eval_tasks: list[MCPTask]
    step_metrics: list[dict[str, float]] = field(default_factory=list)
    ruler_before: Score | None = None
    ruler_after: Score | None = None
    check_before: Score | None = None
    check_after: Score | None = None
    calls_before: Score | None = None
    """Tool calls a held-out rollout made (parsed ones), before and after."""
    calls_after: Score | None = None

    def summary(self) -> str:
        lines = [f"held-out RULER, before vs after side by side: {self.ruler_before} -> {self.ruler_after}"]
        if self.check_before is not None:
            lines.append(f"held-out check: {self.check_before} -> {self.check_after}")
        if self.calls_before is not None:
            lines.append(f"held-out tool calls a rollout: {self.calls_before} -> {self.calls_after}")
        return "\n".join(lines)


async def mcp_rollout(
    model: Any,
    task: MCPTask,
    servers: Servers | MCPToolbox,
    config: MCPRLConfig,
    check: Check | None = None,
) -> Trajectory:
    """One attempt at `task` with the servers' tools and `complete_task`; reward = `check`'s score (or 0)."""
    messages = [{"role": "system", "content": config.system_prompt}, {"role": "user", "content": task.task}]

    async def attempt(toolbox: MCPToolbox) -> Trajectory:
        return await run_agent(
            model,
            toolbox,
            messages,
            max_turns=config.max_turns,
            max_tokens=config.max_tokens,
            offer_complete_task=True,
            metadata={"task": task.task, "difficulty": task.difficulty},
        )

    if isinstance(servers, MCPToolbox):
        trajectory = await attempt(servers)
    else:
        specs = servers(task) if callable(servers) else servers
        async with MCPToolbox(list(specs), tool_timeout_s=config.tool_timeout_s) as toolbox:
            trajectory = await attempt(toolbox)
    trajectory.reward = 0.0
    if check is not None:
        score = check(task, trajectory)
        trajectory.reward = float(await score if isinstance(score, Awaitable) else score)
        trajectory.metrics["check"] = trajectory.reward
    return trajectory


async def _evaluate(
    model: Any, tasks: list[MCPTask], servers: Servers | MCPToolbox, config: MCPRLConfig, check: Check | None, desc: str
) -> list[Trajectory]:
    return await gather_trajectories(
        (mcp_rollout(model, t, servers, config, check) for t in tasks), max_exceptions=0, desc=desc
    )


async def _tasks(
    model: TrainableModel,
    servers: Servers,
    config: MCPRLConfig,
    writer: JudgeModel | None,
    train_tasks: list[MCPTask] | None,
    eval_tasks: list[MCPTask] | None,
) -> tuple[list[MCPTask], list[MCPTask]]:
    """The training and held-out tasks: as given, else written by `writer` (the base model by default) from
    the servers' tools; both recorded in the run folder."""
    writer = writer or model.backend.base_model()
    # A per-task callable is asked once for a task with empty metadata, to list the tools before tasks exist.
    listing_servers = servers(MCPTask(task="(listing the tools)")) if callable(servers) else servers
    async with MCPToolbox(list(listing_servers), tool_timeout_s=config.tool_timeout_s) as listing:
        tools, resources = listing.tools, listing.resources
    instructions = config.custom_instructions
    if train_tasks is None:
        needed = config.steps * config.tasks_per_step
        train_tasks = await generate_tasks(tools, needed, writer, resources=resources, custom_instructions=instructions)
    if eval_tasks is None:
        eval_tasks = await generate_tasks(
            tools, config.num_eval_tasks, writer, resources=resources, custom_instructions=instructions
        )
    write_text_atomic(model.run_dir / "mcp_train_tasks.jsonl", tasks_to_jsonl(train_tasks))
    write_text_atomic(model.run_dir / "mcp_eval_tasks.jsonl", tasks_to_jsonl(eval_tasks))
    return train_tasks, eval_tasks


async def train_mcp_rl(
    model: TrainableModel,
    servers: Servers,
    *,
    config: MCPRLConfig | None = None,
    writer: JudgeModel | None = None,
    judge: JudgeModel | None = None,
    train_tasks: list[MCPTask] | None = None,
    eval_tasks: list[MCPTask] | None = None,
    check: Check | None = None,
) -> MCPRLReport:
    """Train `model` (registered) on an MCP server's tools: tasks written by `writer` unless given,
    RULER by `judge` as the reward, held-out before/after reported. `writer` and `judge` default to
    the untrained base model on the model's own server; any litellm id or `agentrl.Model` works."""
    config = config or MCPRLConfig()
    if config.steps < 1 or config.tasks_per_step < 1 or config.group_size < 2:
        raise ConfigurationError(
            "MCP-RL needs steps >= 1, tasks_per_step >= 1 and group_size >= 2 (RULER ranks a group)"
        )
    judge = judge or model.backend.base_model()
    train_tasks, eval_tasks = await _tasks(model, servers, config, writer, train_tasks, eval_tasks)
    report = MCPRLReport(train_tasks=train_tasks, eval_tasks=eval_tasks)

    async def scored(group: TrajectoryGroup) -> TrajectoryGroup:
        return await ruler_score_group(group, judge, swallow_exceptions=True)

    async def run(where: Servers | MCPToolbox) -> None:
        before = await _evaluate(model, eval_tasks, where, config, check, "held-out before")
        await model.log(before, split="val")  # metrics.jsonl, transcript and reward.png, at the starting step
        first, tasks, attempts = await model.get_step(), range(config.tasks_per_step), range(config.group_size)

        def step_groups(model: TrainableModel, step: int) -> list[TrajectoryGroup]:
            batch = (train_tasks[((step - first) * config.tasks_per_step + i) % len(train_tasks)] for i in tasks)
            return [TrajectoryGroup(mcp_rollout(model, t, where, config, check) for _ in attempts) for t in batch]

        results = await train_pipelined(  # agentrl's one training loop, synchronous
            model,
            step_groups,
            steps=config.steps,
            max_steps_off_policy=0,
            config=TrainConfig(learning_rate=config.learning_rate),
            after_each=scored,
            max_exception_rate=0.25,
        )
        report.step_metrics.extend(result.metrics for result in results)
        after = await _evaluate(model, eval_tasks, where, config, check, "held-out after")
        await model.log(after, split="val")
        for trajectory in before:
            trajectory.metadata["arm"] = "before"
        for trajectory in after:
            trajectory.metadata["arm"] = "after"
        # The pair's order alternates, so a judge that favours one position favours neither arm overall.
        pairs = await gather_trajectory_groups(
            (
                TrajectoryGroup([b, a] if i % 2 == 0 else [a, b])
                for i, (b, a) in enumerate(zip(before, after, strict=True))
            ),
            after_each=scored,
            max_exception_rate=1.0,
            desc="RULER before vs after",
        )
        judged = [{t.metadata["arm"]: t.reward for t in g.trajectories} for g in pairs if len(g.trajectories) == 2]
        report.ruler_before = Score.of([arms["before"] for arms in judged])
        report.ruler_after = Score.of([arms["after"] for arms in judged])
        report.calls_before = Score.of([t.metrics["tool_calls"] for t in before])
        report.calls_after = Score.of([t.metrics["tool_calls"] for t in after])
        if check is not None:
            report.check_before = Score.of([t.metrics["check"] for t in before])
            report.check_after = Score.of([t.metrics["check"] for t in after])

    if callable(servers) or not config.shared_session:
        await run(servers)
    else:
        async with MCPToolbox(list(servers), tool_timeout_s=config.tool_timeout_s) as shared:
            await run(shared)
    return report
