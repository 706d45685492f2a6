"""Trajectories: what rollouts produce and what training consumes.

- `History`: one conversation, a list that mixes plain message dicts (system, user, tool results,
  assistant turns written by hand) with the `openai` `Choice` objects the server returned. A Choice
  keeps the sampled token ids and logprobs, which training needs; a plain assistant dict has none.
- `Trajectory`: one attempt at a scenario. A `History` plus the reward, float metrics, metadata
  (any JSON), free-text logs, and `additional_histories` for agents that branch or summarise their
  context (every history of a trajectory is trained with the trajectory's advantage).

`TrajectoryGroup` (`agentrl.data.trajectory_group`) holds the attempts at one scenario. All are pydantic models and round-trip through JSON, Choices included (token ids and
logprobs survive).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Annotated, Any

from openai.types.chat.chat_completion import Choice
from pydantic import BaseModel, ConfigDict, Field, JsonValue, PrivateAttr, field_validator, model_validator

from agentrl.data.messages import CheckedList, MessageOrChoice, choice_to_message
from agentrl.foundation.errors import RewardError
from agentrl.foundation.sampled_record import SampledRecord

FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]


POLICY_VERSIONS = frozenset({"initial_policy_version", "final_policy_version"})
"""ART's Trajectory fields that agentrl reads from the gateway's stamps unless a caller states them."""


class History(BaseModel):
    """One conversation: message dicts and sampled Choices, and the tools offered to the model."""

    model_config = ConfigDict(extra="forbid")

    messages_and_choices: list[MessageOrChoice] = Field(default_factory=list)
    """The conversation in order; Choices are assistant turns sampled by the server."""
    tools: list[dict[str, Any]] | None = None
    """OpenAI tool schemas offered to the model, or None when the agent has no tools."""

    @field_validator("messages_and_choices", mode="after")
    @classmethod
    def _checked_on_append(cls, items: list[Any]) -> list[Any]:
        return CheckedList(items)

    def messages(self) -> list[dict[str, Any]]:
        """The conversation as plain message dicts, ready to send to a chat-completions endpoint."""
        return [choice_to_message(m) if isinstance(m, Choice) else m for m in self.messages_and_choices]

    def choices(self) -> list[Choice]:
        """The sampled assistant turns (the ones training uses)."""
        return [m for m in self.messages_and_choices if isinstance(m, Choice)]


class Trajectory(History):
    """One rollout: its conversation, its reward, and what was observed along the way.

    Assignments are validated like the constructor (`traj.reward = float("nan")` raises), since
    rollouts set the reward after building the trajectory and a NaN would poison the whole step.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    reward: FiniteFloat = 0.0
    """Scalar reward; GRPO compares it with the other trajectories of the same group."""
    metrics: dict[str, FiniteFloat] = Field(default_factory=dict)
    """Numbers to average and plot (e.g. max tile, turns); never used as the reward itself."""
    metadata: dict[str, JsonValue] = Field(default_factory=dict)
    """What identifies the rollout (scenario id, seed; lists and dicts too, anything JSON holds); logged, not
    averaged."""
    logs: list[str] = Field(default_factory=list)
    """Free-text notes (judge explanations, errors the agent recovered from)."""
    additional_histories: list[History] = Field(default_factory=list)
    """Further conversations of the same rollout (branches, summarised contexts), trained alike."""

    @field_validator("reward", mode="before")
    @classmethod
    def _reward_is_a_number(cls, value: Any) -> Any:
        # Anything float() takes (numpy scalars, bools, tensors of one value), but never text or None.
        try:
            number = None if isinstance(value, (str, bytes)) or value is None else float(value)
        except (TypeError, ValueError):
            number = None
        if number is None:
            raise ValueError(f"reward must be a finite number, got {value!r}; set `traj.reward` to a float")
        if not math.isfinite(number):
            raise ValueError(f"reward must be a finite number, got {value!r}; fix the reward function")
        return number

    @field_validator("metrics", mode="before")
    @classmethod
    def _bools_to_floats(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: float(v) if isinstance(v, bool) else v for k, v in value.items()}
        return value

    _started_s: float = PrivateAttr(default_factory=time.monotonic)
    _started_at: datetime = PrivateAttr(default_factory=lambda: datetime.now(UTC))

    @property
    def start_time(self) -> datetime:
        """When this trajectory was made (UTC; ART's `start_time`)."""
        return self._started_at

    def __eq__(self, other: object) -> bool:
        # Equal when their data are (pydantic would also compare the private start time, which no copy keeps).
        if not isinstance(other, Trajectory):
            return NotImplemented
        return type(self) is type(other) and self.__dict__ == other.__dict__

    def log(self, message: str) -> None:
        """Keep a free-text note with the trajectory (shown with its transcript)."""
        self.logs = [*self.logs, str(message)]

    def track_duration(self, name: str) -> _DurationTracker:
        """Add the seconds a block takes to `metrics[f"{name}_duration"]` (summed over blocks, ART's name);
        use it as `with` or `async with`."""
        return _DurationTracker(self, f"{name}_duration")

    def finish(self) -> Trajectory:
        """Record the seconds since this trajectory was made in `metrics["duration"]` (ART's name);
        returns the trajectory, so a rollout can end with `return trajectory.finish()`."""
        self.metrics = {**self.metrics, "duration": time.monotonic() - self._started_s}
        return self

    def histories(self) -> list[History]:
        """The main conversation followed by the additional ones."""
        return [History(messages_and_choices=self.messages_and_choices, tools=self.tools), *self.additional_histories]

    def policy_steps(self) -> list[int | None]:
        """The adapter step that sampled each of its sampled turns, in order, as the gateway stamped them; None
        for a turn without a stamp (written by hand, or from a client that dropped the gateway's fields)."""
        return [SampledRecord.of(choice).policy_step for history in self.histories() for choice in history.choices()]

    @model_validator(mode="before")
    @classmethod
    def _stated_policy_versions(cls, data: Any) -> Any:
        """ART's `Trajectory(initial_policy_version=..., final_policy_version=...)`: a version stated by the caller is
        kept in `metadata` under its name, and wins over the one read from the stamped turns."""
        if isinstance(data, dict) and POLICY_VERSIONS & data.keys():
            data = dict(data)
            stated = {k: data.pop(k) for k in POLICY_VERSIONS & data.keys() if data[k] is not None}
            data["metadata"] = {**dict(data.get("metadata") or {}), **stated}
        return data

    @property
    def initial_policy_version(self) -> int | None:
        """The step of the adapter that sampled its first turn (None when no turn says), unless one was stated."""
        if isinstance(stated := self.metadata.get("initial_policy_version"), int):
            return stated
        steps = [step for step in self.policy_steps() if step is not None]
        return steps[0] if steps else None

    @property
    def final_policy_version(self) -> int | None:
        """The step of the adapter that sampled its last turn (None when no turn says), unless one was stated."""
        if isinstance(stated := self.metadata.get("final_policy_version"), int):
            return stated
        steps = [step for step in self.policy_steps() if step is not None]
        return steps[-1] if steps else None

    def for_logging(self) -> dict[str, Any]:
        """A JSON-ready dict: messages as plain dicts (token data left out), each flagged `trainable` when the model
        sampled it (ART's shape), reward, metrics, metadata, logs."""
        return {
            "reward": self.reward,
            "metrics": dict(self.metrics),
            "metadata": dict(self.metadata),
            "messages": [
                {**message, "trainable": isinstance(item, Choice)}
                for item, message in zip(self.messages_and_choices, self.messages(), strict=True)
            ],
            "tools": self.tools,
            "logs": list(self.logs),
            "additional_histories": [{"messages": h.messages(), "tools": h.tools} for h in self.additional_histories],
            "initial_policy_version": self.initial_policy_version,
            "final_policy_version": self.final_policy_version,
        }


class _DurationTracker:
    """The block timer behind `Trajectory.track_duration`, for `with` and `async with` alike."""

    def __init__(self, trajectory: Trajectory, key: str) -> None:
        self.trajectory, self.key = trajectory, key

    def __enter__(self) -> None:
        self.started = time.monotonic()

    def __exit__(self, *exc_info: object) -> None:
        metrics = self.trajectory.metrics
        self.trajectory.metrics = {**metrics, self.key: metrics.get(self.key, 0.0) + time.monotonic() - self.started}

    async def __aenter__(self) -> None:
        self.__enter__()

    async def __aexit__(self, *exc_info: object) -> None:
        self.__exit__(*exc_info)


def check_reward(trajectory: Trajectory, where: str) -> None:
    """Raise `RewardError` naming `where` unless the trajectory's reward is a finite number.

    Assignments are validated, but `model_construct`, `__dict__` or `object.__setattr__` bypass
    that; this check runs where rewards enter GRPO (gather and train), so nothing bypasses it.
    """
    reward = trajectory.__dict__.get("reward")
    if not isinstance(reward, (int, float)) or not math.isfinite(reward):
        raise RewardError(
            f"{where} has reward {reward!r}; a reward must be a finite number (set `traj.reward` to a float in "
            "the rollout, and make the reward function return one for every outcome)"
        )


def reward_stats(rewards: Iterable[float]) -> tuple[float, float]:
    """Mean and population std of some rewards ((nan, nan) for none)."""
    values = list(rewards)
    if not values:
        return math.nan, math.nan
    mean = sum(values) / len(values)
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
