"""RemoteBackend: the `Backend` protocol over HTTP, to an `agentrl backend serve` service on another host.

A notebook on a laptop registers, trains and logs as with `LocalBackend`; the GPU host runs the
server and the trainer. Rollouts sample from the service's gateway (`model.openai_client()` and
`model.litellm_params()` point there), so the same rollout code runs unchanged. They get the
service's sampling token, which the service hands over at register: this backend keeps the admin
token to itself. A step request carries an id and the step it was made at, so a step whose answer
was lost (a dropped connection, a proxy's timeout) is retried here without ever being applied twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

import httpx
from pydantic import BaseModel

import agentrl.foundation.errors
from agentrl.backend.remote.wire import (
    REGISTERED_FIELDS,
    SERVICE_HEADER,
    TOKEN_ENV,
    DeleteRequest,
    ErrorReply,
    LogRequest,
    ModelRef,
    RegisterReply,
    RegisterRequest,
    SessionRequest,
    SFTRequest,
    TrainRequest,
)
from agentrl.foundation.endpoint import InferenceEndpoint
from agentrl.foundation.errors import AgentRLError, ConfigurationError, ServerError
from agentrl.foundation.openmp_spin import BOUNDED_SPIN_TURNS, SPIN_VARIABLE

if TYPE_CHECKING:
    from agentrl.client.backend_protocol import TrainResult
    from agentrl.client.model import Model, TrainableModel
    from agentrl.data.trajectory import History
    from agentrl.data.trajectory_group import TrajectoryGroup
    from agentrl.foundation.config import SFTConfig, TrainConfig


class RemoteBackend:
    """Trains and serves models on an `agentrl backend serve` service at `url` ("http://gpu-host:8000").

    `token` is the service's admin token (default: the AGENTRL_TOKEN environment variable; a service
    that generated it keeps it in `backend.token` beside its runs). `step_retries`: how often a step
    whose answer was lost in transit is asked for again (the same request: applied once).
    """

    def __init__(
        self, url: str, *, token: str | None = None, timeout_s: float | None = None, step_retries: int = 3
    ) -> None:
        token = token or os.environ.get(TOKEN_ENV, "").strip()
        if not token:
            raise ConfigurationError(
                f"RemoteBackend({url!r}) needs the service's token: pass token=... or set {TOKEN_ENV} (a service "
                "that generated it keeps it in backend.token beside its runs, mode 0600)"
            )
        self.url = url.rstrip("/").removesuffix("/v1")
        self._token = token
        self.step_retries = step_retries
        self._instance: str | None = None  # the service instance this backend's models registered with
        self._sampling_token: str | None = None  # what rollouts get; handed over by the service at register
        self._spins_beside_cpu_server = False  # the service's word at register (`pipelined_spin_fix`)
        self._steps: dict[tuple[str, str], int] = {}  # each model's step as last seen, sent with step requests
        # A step takes as long as it takes (timeout_s None); connecting should not.
        self._client = httpx.AsyncClient(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token}"},  # the admin token: never handed to rollouts
            timeout=httpx.Timeout(timeout_s, connect=30.0),
        )

    def __repr__(self) -> str:
        return f"RemoteBackend({self.url!r})"

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
                f"the agentrl backend at {self.url} refused the token: give its admin token (token=... or "
                f"{TOKEN_ENV}; a service that generated it keeps it in backend.token beside its runs)"
            )
        if response.status_code == 403 and not response.headers.get(SERVICE_HEADER):
            raise ConfigurationError(
                f"the agentrl backend at {self.url} took this token for its sampling token, which cannot train: "
                f"give RemoteBackend its admin token (token=... or {TOKEN_ENV})"
            )
        if response.status_code == 404 and not response.headers.get(SERVICE_HEADER):
            raise ServerError(f"{self.url} answered 404 to {path}: it is not an agentrl backend service")
        if response.status_code != 200:
            raise _error_from(response, self.url)
        return response.json()

    async def _step_call(self, path: str, message: TrainRequest | SFTRequest) -> TrainResult:
        """A step request, named by a new id and the model's step as last seen, asked again (same id) when its
        answer is lost in transit: the service applies it once and answers every attempt with the same result."""
        from agentrl.client.backend_protocol import TrainResult

        key = (message.model.project, message.model.name)
        message = message.model_copy(update={"request_id": uuid.uuid4().hex, "from_step": self._steps.get(key)})
        for attempt in range(self.step_retries + 1):
            try:
                result = TrainResult(**await self._call(path, message))
                self._steps[key] = result.step
                return result
            except ServerError as error:
                if attempt == self.step_retries or not isinstance(error.__cause__, httpx.TransportError):
                    raise
                await asyncio.sleep(2.0**attempt)
        raise AssertionError("unreachable")

    def _ref(self, model: TrainableModel) -> ModelRef:
        return ModelRef(project=model.project, name=model.name)

    async def register(self, model: TrainableModel) -> int:
        """Register `model` on the service: it resumes from the run's latest checkpoint there and serves it.

        Only the settings you set are sent; the base model and server settings you leave out are the
        service's (its operator fixes them), and ones it does not offer are refused by name."""
        fields = model.model_dump(mode="json", include=set(REGISTERED_FIELDS) & (model.model_fields_set | {"name"}))
        fields["project"] = model.project
        reply = RegisterReply.model_validate(await self._call("/backend/register", RegisterRequest(model=fields)))
        self._instance, self._sampling_token = reply.service, reply.sampling_token
        self._spins_beside_cpu_server = reply.spins_beside_cpu_server
        self._steps[(model.project, model.name)] = reply.step
        return reply.step

    async def get_step(self, model: TrainableModel) -> int:
        step = int((await self._call("/backend/get_step", self._ref(model)))["step"])
        self._steps[(model.project, model.name)] = step
        return step

    async def train(
        self,
        model: TrainableModel,
        groups: list[TrajectoryGroup],
        config: TrainConfig,
        *,
        step_metrics: dict[str, float] | None = None,
        dropped: Sequence[TrajectoryGroup] = (),
    ) -> TrainResult:
        request = TrainRequest(
            model=self._ref(model), groups=groups, config=config, step_metrics=step_metrics or {}, dropped=list(dropped)
        )
        return await self._step_call("/backend/train", request)

    async def train_sft(self, model: TrainableModel, histories: list[History], config: SFTConfig) -> TrainResult:
        request = SFTRequest(model=self._ref(model), histories=histories, config=config)
        return await self._step_call("/backend/train_sft", request)

    async def log(self, model: TrainableModel, groups: list[TrajectoryGroup], split: str) -> dict[str, float]:
        metrics: dict[str, float] = await self._call(
            "/backend/log", LogRequest(model=self._ref(model), groups=groups, split=split)
        )
        return metrics

    async def delete_checkpoints(self, model: TrainableModel, *, keep_last: int, best_by: str | None) -> list[int]:
        request = DeleteRequest(model=self._ref(model), keep_last=keep_last, best_by=best_by)
        return [int(step) for step in await self._call("/backend/delete_checkpoints", request)]

    @property
    def sampling_token(self) -> str:
        """The token rollouts, judges and agent frameworks get: it samples, and cannot train or register."""
        if self._sampling_token is None:
            raise AgentRLError(
                f"no model is registered through this RemoteBackend yet; call `await model.register(backend)` first "
                f"(the service at {self.url} hands over its sampling token then)"
            )
        return self._sampling_token

    def endpoint(self, model: TrainableModel) -> InferenceEndpoint:
        """The service's gateway, with the sampling token."""
        return InferenceEndpoint(f"{self.url}/v1", self.sampling_token)

    async def open_session(self, model: TrainableModel) -> str:
        return str((await self._call("/backend/open_session", SessionRequest(model=self._ref(model))))["session_id"])

    async def close_session(
        self, model: TrainableModel, session_id: str
    ) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        request = SessionRequest(model=self._ref(model), session_id=session_id)
        exchanges = (await self._call("/backend/close_session", request))["exchanges"]
        return [(body, answer) for body, answer in exchanges]

    def pipelined_spin_fix(self) -> str | None:
        """What would stop the service's trainer and its CPU server stealing each other's cores in a pipelined
        run, as the service reported at the last `register`; None when it said nothing needs to change."""
        if not self._spins_beside_cpu_server:
            return None
        return (
            f"the backend service at {self.url} trains and serves on one CPU with OpenMP's spin unbounded; restart "
            f"it with `agentrl backend serve --pipelined` (or {SPIN_VARIABLE}={BOUNDED_SPIN_TURNS} in its environment)"
        )

    @contextlib.asynccontextmanager
    async def pipelined_cores(self) -> AsyncIterator[bool]:
        """`ReportsSpinning`: the service's trainer is another process's; only `pipelined_spin_fix` can help there."""
        yield False

    def base_model(self) -> Model:
        """The untrained base model on the service's server ("base"), reached with the sampling token."""
        from agentrl.client.model import Model

        return Model(
            name="base", base_url=f"{self.url}/v1", api_key=self.sampling_token, litellm_provider="hosted_vllm"
        )

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
    cls = getattr(agentrl.foundation.errors, reply.type, None)
    if isinstance(cls, type) and issubclass(cls, AgentRLError):
        return cls(f"{reply.message} (from the agentrl backend at {url})")
    if reply.type == "ValidationError":
        return ConfigurationError(f"the agentrl backend at {url} refused the request: {reply.message}")
    return AgentRLError(f"the agentrl backend at {url} failed: {reply.type}: {reply.message}")
