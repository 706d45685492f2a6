"""ART's `art.trajectories`: agentrl's trajectories are ART's (iterable groups, awaitable when built
from rollouts, exceptions kept, `for_logging`, policy versions from the gateway's stamps)."""

from agentrl.trajectory import History, Trajectory, TrajectoryGroup

__all__ = ["History", "Trajectory", "TrajectoryGroup"]
