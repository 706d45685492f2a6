"""A session URL for one rollout on a backend's gateway: every chat completion an agent sends under it (an agent in
another process, or a program that only takes a base URL) becomes the rollout's trajectory, as
`agentrl.client.capture` records it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentrl.client.capture import capture_counts, record_completion
from agentrl.data.trajectory import Trajectory

if TYPE_CHECKING:
    from agentrl.foundation.endpoint import InferenceEndpoint


@dataclass
class RolloutSession:
    """A base URL for one rollout: every chat completion sent under it goes into `trajectory`, for an
    agent in another process or a program that only takes a base URL (OPENAI_BASE_URL)."""

    base_url: str
    api_key: str
    model: str
    """The name to ask for (the model's current adapter)."""
    trajectory: Trajectory = field(default_factory=Trajectory)


@contextlib.asynccontextmanager
async def rollout_session(
    endpoint: InferenceEndpoint,
    model: str,
    open_session: Callable[[], Awaitable[str]],
    close_session: Callable[[str], Awaitable[list[tuple[dict[str, Any], dict[str, Any]]]]],
) -> AsyncIterator[RolloutSession]:
    """A session URL on a backend's gateway (local or a remote service's) for the block, asking for `model`
    (`TrainableModel.session()` opens one): at its end the session is closed (later requests on it get
    404) and its completions fill `session.trajectory`, turn by turn as `capture_trajectory` records them.
    Set the reward after the block."""
    session_id = await open_session()
    session = RolloutSession(f"{endpoint.base_url}/sessions/{session_id}", endpoint.api_key, model)
    try:
        yield session
    finally:
        for request, answer in await close_session(session_id):
            if capture_counts(answer, None):
                record_completion(session.trajectory, request, answer)
