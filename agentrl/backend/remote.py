"""RemoteBackend: the `Backend` protocol over HTTP, to an `agentrl backend serve` service on another host.

A notebook on a laptop registers, trains and logs as with `LocalBackend`; the GPU host runs the
server and the trainer. Rollouts sample from the service's gateway (`model.openai_client()` and
`model.litellm_params()` point there, with the token), so the same rollout code runs unchanged.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import httpx
from pydantic import BaseModel

import agentrl.errors
from agentrl.backend.protocol import InferenceEndpoint
from agentrl.backend.wire import (
    REGISTERED_FIELDS,
    SERVICE_HEADER,
    TOKEN_ENV,
    DeleteRequest,
    ErrorReply,
    LogRequest,
    ModelRef,
    RegisterRequest,
    SFTRequest,
    TrainRequest,
)
from agentrl.errors import AgentRLError, ConfigurationError, ServerError

if TYPE_CHECKING:
    from agentrl.config import SFTConfig, TrainConfig
    from agentrl.model import Model, TrainableModel, TrainResult
    from agentrl.trajectory import History, TrajectoryGroup


class RemoteBackend:
    """Trains and serves models on an `agentrl backend serve` service at `url` ("http://gpu-host:8000").

    `token` defaults to the AGENTRL_TOKEN environment variable; the service printed it when it
    generated it, and keeps it in `backend.token` beside its runs.
    """

    def __init__(self, url: str, *, token: str | None = None, timeout_s: float | None = None) -> None:
        token = token or os.environ.get(TOKEN_ENV, "").strip()
        if not token:
            raise ConfigurationError(
                f"RemoteBackend({url!r}) needs the service's token: pass token=... or set {TOKEN_ENV} (the service "
                "printed it when it generated it, and keeps it in backend.token beside its runs)"
            )
        self.url = url.rstrip("/").removesuffix("/v1")
        self.token = token
        self._instance: str | None = None  # the service instance this backend's models registered with
        # A step takes as long as it takes (timeout_s None); connecting should not.
        self._client = httpx.AsyncClient(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=httpx.Timeout(timeout_s, connect=30.0),
        )

    async def _call(self, path: str, message: BaseModel) -> Any:
        headers = {SERVICE_HEADER: self._instance} if self._instance else {}  # the service ignores it on register
        try:
            response = await self._client.post(path, content=message.model_dump_json(), headers=headers)
        except httpx.TransportError as error:
            raise ServerError(
                f"cannot reach the agentrl backend at {self.url} ({type(error).__name__}: {error}); is "
                "`agentrl backend serve` running there, and is the URL right?"
            ) from error
        if response.status_code == 401:
            raise ConfigurationError(
                f"the agentrl backend at {self.url} refused the token: give the one it printed at start "
                f"(token=... or {TOKEN_ENV}; the service keeps it in backend.token beside its runs)"
            )
        if response.status_code == 404 and not response.headers.get(SERVICE_HEADER):
            raise ServerError(f"{self.url} answered 404 to {path}: it is not an agentrl backend service")
        if response.status_code != 200:
            raise _error_from(response, self.url)
        return response.json()

    def _ref(self, model: TrainableModel) -> ModelRef:
        return ModelRef(project=model.project, name=model.name)

    async def register(self, model: TrainableModel) -> int:
        """Register `model` on the service: it resumes from the run's latest checkpoint there and serves it."""
        fields = model.model_dump(mode="json", include=set(REGISTERED_FIELDS))
        reply = await self._call("/backend/register", RegisterRequest(model=fields))
        self._instance = reply["service"]
        return int(reply["step"])

    async def get_step(self, model: TrainableModel) -> int:
        return int((await self._call("/backend/get_step", self._ref(model)))["step"])

    async def train(
        self,
        model: TrainableModel,
        groups: list[TrajectoryGroup],
        config: TrainConfig,
        *,
        step_metrics: dict[str, float] | None = None,
    ) -> TrainResult:
        from agentrl.model import TrainResult

        request = TrainRequest(model=self._ref(model), groups=groups, config=config, step_metrics=step_metrics or {})
        return TrainResult(**await self._call("/backend/train", request))

    async def train_sft(self, model: TrainableModel, histories: list[History], config: SFTConfig) -> TrainResult:
        from agentrl.model import TrainResult

        request = SFTRequest(model=self._ref(model), histories=histories, config=config)
        return TrainResult(**await self._call("/backend/train_sft", request))

    async def log(self, model: TrainableModel, groups: list[TrajectoryGroup], split: str) -> dict[str, float]:
        metrics: dict[str, float] = await self._call(
            "/backend/log", LogRequest(model=self._ref(model), groups=groups, split=split)
        )
        return metrics

    async def delete_checkpoints(self, model: TrainableModel, *, keep_last: int, best_by: str | None) -> list[int]:
        request = DeleteRequest(model=self._ref(model), keep_last=keep_last, best_by=best_by)
        return [int(step) for step in await self._call("/backend/delete_checkpoints", request)]

    def endpoint(self, model: TrainableModel) -> InferenceEndpoint:
        """The service's gateway, with the token."""
        return InferenceEndpoint(f"{self.url}/v1", self.token)

    def base_model(self) -> Model:
        """The untrained base model on the service's server ("base")."""
        from agentrl.model import Model

        return Model(name="base", base_url=f"{self.url}/v1", api_key=self.token, litellm_provider="hosted_vllm")

    async def close(self) -> None:
        """Close the connection; the service keeps running, and keeps the models registered."""
        await self._client.aclose()

    async def __aenter__(self) -> RemoteBackend:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _error_from(response: httpx.Response, url: str) -> AgentRLError:
    """The service's error as the same agentrl error class, saying where it came from."""
    try:
        reply = ErrorReply.model_validate_json(response.content)
    except ValueError:
        return ServerError(f"the agentrl backend at {url} answered {response.status_code}: {response.text[:500]}")
    if reply.type == "ServiceRestarted":
        return ServerError(f"the agentrl backend at {url}: {reply.message}")
    cls = getattr(agentrl.errors, reply.type, None)
    if isinstance(cls, type) and issubclass(cls, AgentRLError):
        return cls(f"{reply.message} (from the agentrl backend at {url})")
    if reply.type == "ValidationError":
        return ConfigurationError(f"the agentrl backend at {url} refused the request: {reply.message}")
    return AgentRLError(f"the agentrl backend at {url} failed: {reply.type}: {reply.message}")
