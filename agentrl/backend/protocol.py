"""The seam between a model and whatever serves and trains it: the `Backend` protocol.

`TrainableModel` depends on this protocol alone, never on a concrete backend, so the same model
object (and the user's rollout code) works with `LocalBackend` in this process, with
`RemoteBackend` on another host, and with a fake in unit tests. `InferenceEndpoint` is all a
model needs to sample: where the backend's gateway is, its token, and how to tell that the
server behind it died.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from agentrl.config import SFTConfig, TrainConfig
    from agentrl.model import Model, TrainableModel, TrainResult
    from agentrl.trajectory import History, TrajectoryGroup


@dataclass(frozen=True)
class InferenceEndpoint:
    """Where a backend serves a model's current adapter, and how to talk to it."""

    base_url: str
    """OpenAI-compatible root, e.g. "http://127.0.0.1:8000/v1"."""
    api_key: str = field(repr=False)
    """Bearer token the gateway requires (never shown in a repr)."""
    death_notice: Callable[[], str | None] | None = None
    """None while the server runs, else what happened to it (exit, log tail); None when unknowable."""


@runtime_checkable
class Backend(Protocol):
    """Serves a `TrainableModel`'s latest checkpoint and trains it. Every call that waits is async."""

    async def register(self, model: TrainableModel) -> int:
        """Take the model's run, resume its latest checkpoint (or create step 0), serve it; returns the step."""
        ...

    async def get_step(self, model: TrainableModel) -> int:
        """The step of the checkpoint now served."""
        ...

    async def train(
        self,
        model: TrainableModel,
        groups: list[TrajectoryGroup],
        config: TrainConfig,
        *,
        step_metrics: dict[str, float] | None = None,
    ) -> TrainResult:
        """One GRPO step; the new checkpoint is served when it returns (or the skip says why). `step_metrics`
        are recorded with the step's own."""
        ...

    async def train_sft(self, model: TrainableModel, histories: list[History], config: SFTConfig) -> TrainResult:
        """Supervised training on demonstrations, checkpointed and served like a step."""
        ...

    async def log(self, model: TrainableModel, groups: list[TrajectoryGroup], split: str) -> dict[str, float]:
        """Record evaluation groups at the current step; returns their averaged metrics."""
        ...

    async def delete_checkpoints(self, model: TrainableModel, *, keep_last: int, best_by: str | None) -> list[int]:
        """Delete old checkpoints but the last `keep_last` and the best by `best_by`; returns deleted steps."""
        ...

    def endpoint(self, model: TrainableModel) -> InferenceEndpoint:
        """Where rollouts reach the model's served adapter."""
        ...

    def base_model(self) -> Model:
        """The untrained base model on the same server (a baseline, or a judge that is not the policy)."""
        ...

    async def close(self) -> None:
        """Stop serving and release the run (its lock, servers, W&B run)."""
        ...


@runtime_checkable
class OpensSessions(Protocol):
    """A backend that can open rollout sessions on its gateway (`model.session()`): LocalBackend and
    RemoteBackend; optional for other backends."""

    async def open_session(self, model: TrainableModel) -> str:
        """Open a rollout session on the gateway: its id, the prefix /v1/sessions/{id}/ of its base URL."""
        ...

    async def close_session(
        self, model: TrainableModel, session_id: str
    ) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """Close a rollout session (later requests on it get 404) and return its exchanges, as chat
        completions (request body, answer), in the order they were answered."""
        ...
