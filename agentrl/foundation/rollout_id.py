"""Which rollout a request was sampled for: the task-local id `gather_trajectory_groups` sets, and the header
a backend's client sends it in, under which the gateway tallies each rollout's tokens (the token ledger)."""

from __future__ import annotations

import contextvars

ROLLOUT_HEADER = "x-agentrl-rollout"
"""Request header naming the rollout a completion was sampled for: the gateway tallies tokens under it."""

current_rollout: contextvars.ContextVar[str | None] = contextvars.ContextVar("agentrl_rollout", default=None)
"""The id of the rollout the running task belongs to (set by `gather_trajectory_groups`)."""
