"""The remote backend's messages: what `RemoteBackend` sends to `agentrl backend serve`, as JSON.

Groups travel whole, Choices with their token data (or only their completion id, which the
service's gateway resolves), so the service trains on exactly what its server sampled.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentrl.data.trajectory import History
from agentrl.data.trajectory_group import TrajectoryGroup
from agentrl.foundation.config import SFTConfig, TrainConfig
from agentrl.foundation.files import check_safe_name

SERVICE_HEADER = "x-agentrl-service"
"""Names the service instance: a request made for an earlier instance (before a restart) is refused."""

TOKEN_ENV = "AGENTRL_TOKEN"
"""The service's admin token, on both sides (else the service generates one and saves it beside its runs)."""

SAMPLING_TOKEN_ENV = "AGENTRL_SAMPLING_TOKEN"
"""The service's sampling token (else derived from the admin token); what rollouts and judges hold."""

REGISTERED_FIELDS = frozenset({"name", "project", "base_model", "lora", "server", "wandb"})
"""The fields of a `TrainableModel` that the service uses; the run folder is the service's own."""


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class _Reply(_Message):
    """What the service answers: a field a newer service adds is ignored, so a client of this version still
    reads it (requests stay strict: the service refuses what it does not know)."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class ModelRef(_Message):
    """Which registered model a call is about."""

    project: str
    name: str


class RegisterRequest(_Message):
    model: dict[str, Any]
    """The `REGISTERED_FIELDS` the client set; base model and server settings left out take the operator's."""


class RegisterReply(_Reply):
    step: int
    service: str
    """The service instance (see SERVICE_HEADER)."""
    sampling_token: str
    """What the client hands its rollouts, judges and agent frameworks: it samples, and nothing else."""
    base_model: str
    """The base model the service trains this model on."""
    spins_beside_cpu_server: bool = False
    """Whether the service's trainer and its CPU server would spin on each other's cores in a pipelined run
    (OpenMP's spin unbounded there; `agentrl backend serve --pipelined` bounds it)."""


class StepReply(_Reply):
    step: int


class _StepRequest(_Message):
    request_id: str | None = Field(default=None, min_length=8, max_length=100)
    """The client's name for this step: a retry with the same id gets the first attempt's result, never a
    second step."""
    from_step: int | None = None
    """The step the client saw the model at; if the model has moved on, the request is refused (409)."""


class TrainRequest(_StepRequest):
    model: ModelRef
    groups: list[TrajectoryGroup]
    config: TrainConfig
    step_metrics: dict[str, float] = {}
    dropped: list[TrajectoryGroup] = []
    """Groups sampled for this step and not given it (a pipeline's stale ones): the ledger counts their tokens."""


class SFTRequest(_StepRequest):
    model: ModelRef
    histories: list[History]
    config: SFTConfig


class LogRequest(_Message):
    model: ModelRef
    groups: list[TrajectoryGroup]
    split: str
    """Names files in the run folder, so it is refused unless it is one safe path component."""

    @field_validator("split")
    @classmethod
    def _one_safe_component(cls, value: str) -> str:
        return check_safe_name(value, "split")


class SessionRequest(_Message):
    """Open a rollout session on a model's gateway (`session_id` None), or close one (its id)."""

    model: ModelRef
    session_id: str | None = None


class DeleteRequest(_Message):
    model: ModelRef
    keep_last: int
    best_by: str | None


class ErrorReply(_Reply):
    type: str
    message: str
