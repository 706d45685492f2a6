"""`TrajectoryGroup`: the attempts at one scenario, the unit GRPO compares within, plus the exceptions of the
rollouts that failed (`RolloutException`). Built from trajectories, or from awaitables that
`gather_trajectory_groups` resolves (or that awaiting the group runs)."""

from __future__ import annotations

import asyncio
import inspect
import traceback
from collections.abc import Awaitable, Generator, Iterable, Iterator
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, JsonValue, PrivateAttr, field_validator

from agentrl.data.trajectory import FiniteFloat, Trajectory, check_reward


class RolloutException(BaseModel):
    """An exception that a rollout raised, kept with its group for inspection."""

    type: str
    message: str
    traceback: str = ""
    rollout_id: str | None = None
    """The id `gather_trajectory_groups` gave the failed rollout: the gateway's tally of its sampled tokens."""
    sampled_tokens: int | None = None
    """Tokens of sampled turns this failure discarded, where known here (a judge failure's dropped group)."""

    @classmethod
    def from_exception(
        cls, error: BaseException, *, rollout_id: str | None = None, sampled_tokens: int | None = None
    ) -> RolloutException:
        return cls(
            type=type(error).__name__,
            message=str(error),
            traceback="".join(traceback.format_exception(type(error), error, error.__traceback__)),
            rollout_id=rollout_id,
            sampled_tokens=sampled_tokens,
        )


class TrajectoryGroup(BaseModel):
    """Attempts at one scenario. GRPO's advantages are computed within a group.

    `TrajectoryGroup(rollout(model, s) for _ in range(8))` holds the awaitables unresolved; pass
    such groups to `gather_trajectory_groups`, which runs them and returns resolved groups, or
    `await` the group itself (any failed rollout raises). Exceptions given among the items or as
    `exceptions=` are kept as `RolloutException`s. `len(group)` and `for t in group` are over its
    trajectories.
    """

    model_config = ConfigDict(extra="forbid")

    trajectories: list[Trajectory] = Field(default_factory=list)
    """The rollouts that finished."""
    exceptions: list[RolloutException] = Field(default_factory=list)
    """What the failed rollouts raised."""
    metadata: dict[str, JsonValue] = Field(default_factory=dict)
    """What identifies the scenario (its id, split; anything JSON holds)."""
    metrics: dict[str, FiniteFloat] = Field(default_factory=dict)
    """Numbers about the group as a whole (a judge's cost, its agreement); saved with the group."""
    logs: list[str] = Field(default_factory=list)
    """Free-text notes about the group (a judge's explanation); saved with the group."""

    _pending: list[Awaitable[Trajectory | TrajectoryGroup]] = PrivateAttr(default_factory=list)

    def log(self, message: str) -> None:
        """Keep a free-text note with the group (a judge's verdict on it, say)."""
        self.logs = [*self.logs, str(message)]

    def __init__(
        self,
        trajectories: Iterable[Trajectory | Awaitable[Trajectory | TrajectoryGroup] | BaseException] = (),
        **data: Any,
    ) -> None:
        items = list(trajectories)
        failed = [t for t in items if isinstance(t, BaseException)]
        if failed:
            data["exceptions"] = [*data.get("exceptions", []), *failed]
        finished = [t for t in items if not inspect.isawaitable(t) and not isinstance(t, BaseException)]
        super().__init__(trajectories=finished, **data)
        self._pending = [t for t in items if inspect.isawaitable(t)]

    @field_validator("exceptions", mode="before")
    @classmethod
    def _keep_exceptions_as_records(cls, value: Any) -> Any:
        if isinstance(value, list):
            return [RolloutException.from_exception(e) if isinstance(e, BaseException) else e for e in value]
        return value

    def __iter__(self) -> Iterator[Trajectory]:  # type: ignore[override]
        """Its finished trajectories (not pydantic's field pairs)."""
        return iter(self.trajectories)

    def __len__(self) -> int:
        return len(self.trajectories)

    def __await__(self) -> Generator[Any, None, TrajectoryGroup]:
        """Run the pending rollouts and return the resolved group; a failed rollout raises (after all finished)."""
        return self._resolve().__await__()

    async def _resolve(self) -> TrajectoryGroup:
        results = await asyncio.gather(*self._pending, return_exceptions=True)
        self._pending = []
        finished: list[Trajectory] = []
        for index, result in enumerate(results):
            if isinstance(result, BaseException):
                raise result
            finished.extend(rollout_trajectories(result, f"rollout {index}"))
        return self.with_results([*self.trajectories, *finished])

    def with_results(
        self, trajectories: Iterable[Trajectory], exceptions: list[RolloutException] | None = None
    ) -> TrajectoryGroup:
        """A resolved group for the same scenario: these trajectories (and exceptions, by default this
        group's), with this group's metadata, metrics and logs kept."""
        return TrajectoryGroup(
            trajectories,
            exceptions=self.exceptions if exceptions is None else exceptions,
            metadata=self.metadata,
            metrics=self.metrics,
            logs=self.logs,
        )

    @property
    def pending(self) -> list[Awaitable[Trajectory | TrajectoryGroup]]:
        """Awaitables not yet run; `gather_trajectory_groups` runs them."""
        return list(self._pending)

    @property
    def rewards(self) -> list[float]:
        return [t.reward for t in self.trajectories]

    def model_dump(self, **kwargs: Any) -> dict[str, Any]:
        self._require_resolved()
        return super().model_dump(**kwargs)

    def model_dump_json(self, **kwargs: Any) -> str:
        self._require_resolved()
        return super().model_dump_json(**kwargs)

    def _require_resolved(self) -> None:
        if self._pending:
            raise ValueError(
                f"this TrajectoryGroup still holds {len(self._pending)} unawaited rollouts; "
                "run it through `await agentrl.gather_trajectory_groups([...])` first"
            )


def rollout_trajectories(result: object, where: str) -> list[Trajectory]:
    """What a rollout returned, as trajectories: itself, or a whole group's (ART's `rollout_fn`); each
    reward checked. `TypeError` for anything else, naming `where`."""
    if isinstance(result, TrajectoryGroup):
        trajectories = list(result.trajectories)
    elif isinstance(result, Trajectory):
        trajectories = [result]
    else:
        raise TypeError(f"{where} returned {type(result).__name__}; it must return an agentrl.Trajectory")
    for trajectory in trajectories:
        check_reward(trajectory, where)
    return trajectories
