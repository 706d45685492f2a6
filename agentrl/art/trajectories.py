"""ART's `art.trajectories`: agentrl's trajectories are ART's (iterable groups, awaitable when built from rollouts,
exceptions kept, `for_logging`, policy versions from the gateway's stamps), with ART 0.5.20+'s capture API on top:

    traj = await art.trajectory(rollout(...))          # every chat completion the coroutine makes, recorded
    with art.Trajectory(reward=0.0) as traj: ...       # the same, as a block
    art.current_trajectory(require=True).reward = 1.0  # the trajectory being captured here
    with art.no_capture(): ...                         # a judge's own calls stay out
    group = await art.trajectory_group(rollout(...) for _ in range(4))

Captured calls are recorded as agentrl records them (`agentrl.capture_trajectory(every_endpoint=True)`): as
`messages_and_choices` with the gateway's exact token ids, not as ART's raw `exchanges`, which agentrl does not
keep; `LegacyHistory` is ART 0.5.20+'s name for the history type agentrl calls `History`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
from collections.abc import Awaitable, Coroutine, Iterable, Iterator
from typing import Any

from pydantic import PrivateAttr

import agentrl
from agentrl.client.capture import capture_trajectory
from agentrl.client.capture import no_capture as _no_recording
from agentrl.data.trajectory import History
from agentrl.data.trajectory_group import TrajectoryGroup
from agentrl.foundation.errors import ConfigurationError

LegacyHistory = History
"""ART 0.5.20+'s name for an additional history (`messages_and_choices`, `tools`): agentrl's `History`."""


class Trajectory(agentrl.Trajectory):
    """agentrl's trajectory, usable as ART 0.5.20+'s capture scope: `with art.Trajectory() as t:` records every chat
    completion made inside the block into `t`, and finishes it (its duration) at the end."""

    _scope: contextlib.ExitStack | None = PrivateAttr(default=None)

    def __init__(self, **data: Any) -> None:
        if data.get("exchanges"):
            raise ConfigurationError(
                "Trajectory(exchanges=...) (ART's raw request/response records) has no counterpart: give the "
                "conversation as messages_and_choices, or capture it with art.trajectory(...)"
            )
        data.pop("exchanges", None)
        super().__init__(**data)

    def __enter__(self) -> Trajectory:
        stack = contextlib.ExitStack()
        if self.messages_and_choices or self.tools is not None or self.additional_histories:
            stack.enter_context(_no_recording())  # ART ignores calls captured into a trajectory built by hand
        else:
            stack.enter_context(capture_trajectory(self, every_endpoint=True))
        stack.callback(_scoped.reset, _scoped.set(self))
        self._scope = stack
        return self

    def __exit__(self, *exc: object) -> None:
        scope, self._scope = self._scope, None
        if scope is not None:
            scope.close()
        self.finish()

    def history(self, **_: Any) -> History:
        """The main conversation as a history (ART 0.5.20+'s `history()`; agentrl keeps no exchanges to rebuild)."""
        return self.histories()[0]

    @property
    def exchanges(self) -> Any:
        """ART 0.5.20+ keeps raw request/response exchanges here; agentrl records the same calls as conversations."""
        raise ConfigurationError(
            "Trajectory.exchanges (ART's raw request/response records) has no counterpart: agentrl records captured "
            "calls as conversations with the engine's exact token ids; read trajectory.messages_and_choices, "
            "trajectory.histories() or trajectory.history()"
        )


_scoped: contextvars.ContextVar[Trajectory | None] = contextvars.ContextVar("agentrl_art_trajectory", default=None)
"""The innermost `art.trajectory(...)` or `with art.Trajectory()` scope of this task."""


@contextlib.contextmanager
def no_capture() -> Iterator[None]:
    """ART's: hide the enclosing trajectory scopes (nothing recorded, `current_trajectory()` None) while a new scope
    opened inside still captures."""
    with _no_recording():
        token = _scoped.set(None)
        try:
            yield
        finally:
            _scoped.reset(token)


def current_trajectory(*, require: bool = False) -> Trajectory | None:
    """The trajectory of the innermost `art.trajectory(...)` or `with art.Trajectory()` scope in this task, or None;
    with `require`, a RuntimeError instead of None (ART's)."""
    trajectory = _scoped.get()
    if trajectory is None and require:
        raise RuntimeError("No trajectory is active in this context")
    return trajectory


async def trajectory(coroutine: Coroutine[Any, Any, object]) -> Trajectory:
    """Run `coroutine` (a raw coroutine, as ART requires) capturing every chat completion it makes; returns the
    finished trajectory. Set its reward inside with `art.current_trajectory(require=True).reward = ...`."""
    if isinstance(coroutine, asyncio.Future) or not inspect.iscoroutine(coroutine):
        raise TypeError("Expected a raw coroutine, not a Task, Future, or awaitable")
    with Trajectory() as captured:
        await coroutine
    return captured


async def trajectory_group(
    trajectories: Iterable[agentrl.Trajectory | BaseException | Awaitable[agentrl.Trajectory]],
    *,
    exceptions: Iterable[BaseException] = (),
    metadata: dict[str, Any] | None = None,
    metrics: dict[str, float | int | bool] | None = None,
    logs: list[str] | None = None,
    return_exceptions: bool = False,
) -> TrajectoryGroup:
    """A group from finished trajectories, exceptions and awaitables (run concurrently, outside any capture), in
    input order. A failed rollout raises, the others cancelled, unless `return_exceptions`: then it is kept in the
    group's `exceptions`. An awaitable given twice runs once (ART's)."""
    with no_capture():
        results: list[Any] = []
        tasks: dict[int, asyncio.Future[Any]] = {}
        for item in trajectories:
            if isinstance(item, BaseException) and not isinstance(item, Exception):
                raise item
            if isinstance(item, (agentrl.Trajectory, BaseException)):
                results.append(item)
            else:
                if id(item) not in tasks:
                    tasks[id(item)] = asyncio.ensure_future(item)
                results.append(tasks[id(item)])
        await _finished(set(tasks.values()), return_exceptions=return_exceptions)
    resolved = [(r.exception() or r.result()) if isinstance(r, asyncio.Future) else r for r in results]
    return TrajectoryGroup(
        resolved, exceptions=list(exceptions), metadata=metadata or {}, metrics=metrics or {}, logs=logs or []
    )


async def _finished(pending: set[asyncio.Future[Any]], *, return_exceptions: bool) -> None:
    """Wait for every rollout; the first failure raises, the rest cancelled, unless `return_exceptions` keeps it
    (a cancellation or interrupt always raises)."""
    try:
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                error = task.exception()
                if error is not None and (not return_exceptions or not isinstance(error, Exception)):
                    raise error
                if error is None and not isinstance(task.result(), agentrl.Trajectory):
                    raise TypeError("trajectory_group awaitables must resolve to trajectories")
    except BaseException:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        raise


__all__ = [
    "History",
    "LegacyHistory",
    "Trajectory",
    "TrajectoryGroup",
    "current_trajectory",
    "no_capture",
    "trajectory",
    "trajectory_group",
]
