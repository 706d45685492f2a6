"""The remote backend's messages: what `RemoteBackend` sends to `agentrl backend serve`, as JSON.

Groups travel whole, Choices with their token data (or only their completion id, which the
service's gateway resolves), so the service trains on exactly what its server sampled.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from agentrl.config import SFTConfig, TrainConfig
from agentrl.trajectory import History, TrajectoryGroup

SERVICE_HEADER = "x-agentrl-service"
"""Names the service instance: a request made for an earlier instance (before a restart) is refused."""

TOKEN_ENV = "AGENTRL_TOKEN"
"""The service's bearer token, on both sides (else the service generates one and saves it beside its runs)."""

REGISTERED_FIELDS = frozenset({"name", "project", "base_model", "lora", "server", "wandb"})
"""The fields of a `TrainableModel` that the service uses; the run folder is the service's own."""


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelRef(_Message):
    """Which registered model a call is about."""

    project: str
    name: str


class RegisterRequest(_Message):
    model: dict[str, Any]


class StepReply(_Message):
    step: int


class TrainRequest(_Message):
    model: ModelRef
    groups: list[TrajectoryGroup]
    config: TrainConfig
    step_metrics: dict[str, float] = {}


class SFTRequest(_Message):
    model: ModelRef
    histories: list[History]
    config: SFTConfig


class LogRequest(_Message):
    model: ModelRef
    groups: list[TrajectoryGroup]
    split: str


class DeleteRequest(_Message):
    model: ModelRef
    keep_last: int
    best_by: str | None


class ErrorReply(_Message):
    type: str
    message: str
