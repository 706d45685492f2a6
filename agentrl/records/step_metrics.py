"""A step's metrics line, built once per step: the trainer's metrics, the trajectories' summary (reward mean and
std, each metric's mean), the groups' own metrics, tool-call parse failures, and ART's names for the same figures."""

from __future__ import annotations

from agentrl.data.tool_calls import tool_call_parse_failures
from agentrl.data.trajectory import Trajectory, reward_stats
from agentrl.data.trajectory_group import TrajectoryGroup


def summarize(trajectories: list[Trajectory]) -> dict[str, float]:
    """Mean and std of the reward, and the mean of every metric, over some trajectories."""
    mean, std = reward_stats(t.reward for t in trajectories)
    summary = {"reward_mean": mean, "reward_std": std, "num_trajectories": float(len(trajectories))}
    for key in sorted({k for t in trajectories for k in t.metrics}):
        values = [t.metrics[key] for t in trajectories if key in t.metrics]
        summary[key] = sum(values) / len(values)
    return summary


GROUP_PREFIX = "group/"
"""A step line's key for a group metric's mean over the groups that hold it."""


def summarize_groups(groups: list[TrajectoryGroup]) -> dict[str, float]:
    """`summarize` over the groups' trajectories, and each group metric's mean over the groups that hold it, as
    "group/{name}" (ART 0.5.20+'s key; a logger puts the split before it: "val/group/{name}")."""
    summary = summarize([t for g in groups for t in g.trajectories])
    for key in sorted({k for g in groups for k in g.metrics}):
        values = [g.metrics[key] for g in groups if key in g.metrics]
        summary[f"{GROUP_PREFIX}{key}"] = sum(values) / len(values)
    return summary


ART_METRIC_NAMES = {"reward": "reward_mean", "reward_std_dev": "reward_std"}
"""ART's name of a metric -> agentrl's (metrics.jsonl records both)."""


def with_art_names(metrics: dict[str, float], groups: list[TrajectoryGroup]) -> dict[str, float]:
    """`metrics` plus the names ART users chart: reward, reward_std_dev, exception_rate (failed rollouts
    over all rollouts of these groups)."""
    named = dict(metrics)
    for art_name, name in ART_METRIC_NAMES.items():
        if name in metrics:
            named.setdefault(art_name, metrics[name])
    failed = sum(len(g.exceptions) for g in groups)
    attempted = failed + sum(len(g.trajectories) for g in groups)
    if attempted:
        named.setdefault("exception_rate", failed / attempted)
    return named


def step_line(metrics: dict[str, float], groups: list[TrajectoryGroup], skipped: bool | None) -> dict[str, float]:
    """A step's metrics line: the trainer's metrics with ART's names, the trajectories' own metrics averaged (e.g.
    independent_reward beside a judge's reward), tool-call text the server could not parse where tools were
    offered (`tool_call_parse_failures`, a count), and whether the step was skipped (None: not a train step)."""
    summed = dict(metrics)
    if groups:
        for key, value in summarize_groups(groups).items():
            summed.setdefault(key, value)
    if (failures := tool_call_parse_failures(groups)) is not None:
        summed.setdefault("tool_call_parse_failures", failures)
    named = with_art_names(summed, groups)
    return named if skipped is None else {"skipped": skipped, **named}
