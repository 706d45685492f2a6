"""`agentrl backend serve`: a LocalBackend and its gateway as a service that `RemoteBackend` drives over HTTP.

One port serves both the OpenAI-compatible gateway (/v1/...) that rollouts sample from and the
backend's own routes (/backend/...) for register, train, log and the rest. Two tokens guard them
(`gateway.auth`): the sampling token opens /v1 only; the admin token opens everything. The operator
fixes, at start, what a client may register (`OperatorPolicy`: base models, server settings, LoRA
rank); a client chooses within that and can put nothing on vLLM's command line.

A step runs to its end even if the client that asked for it disconnects, so a client killed
mid-train leaves the run at the old step or the new one, never between. A step request carries an id
and the step it was made at: a retry of it returns the first attempt's result, and a request made at
a step the model has left is refused (409), so no step is ever applied twice.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from agentrl.backend.local import LocalBackend
from agentrl.backend.remote.tokens import ServiceTokens, service_tokens
from agentrl.backend.remote.wire import (
    REGISTERED_FIELDS,
    SERVICE_HEADER,
    DeleteRequest,
    ErrorReply,
    LogRequest,
    ModelRef,
    RegisterReply,
    RegisterRequest,
    SessionRequest,
    SFTRequest,
    StepReply,
    TrainRequest,
    _StepRequest,
)
from agentrl.client.model import TrainableModel
from agentrl.foundation.config import ServerConfig
from agentrl.foundation.errors import (
    AgentRLError,
    BackendBrokenError,
    ConfigurationError,
    NotAllowedError,
    RunLockedError,
    StepConflictError,
    TokenizationError,
)
from agentrl.foundation.files import make_private_dir
from agentrl.foundation.sampled_record import served_name
from agentrl.gateway.limits import GatewayLimits, RequestRefused, read_body

logger = logging.getLogger(__name__)
REMEMBERED_STEP_REQUESTS = 1024
"""Step request ids whose results the service keeps for retries (a few hundred bytes each)."""
M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class OperatorPolicy:
    """What the operator of `agentrl backend serve` fixes at start; a client registers within it."""

    base_models: tuple[str, ...] = (str(TrainableModel.model_fields["base_model"].default),)
    """Base models a client may register (a packaged name, a hub id, a folder on the service's host); the
    first is used when a client names none."""
    server: ServerConfig = ServerConfig()
    """The vLLM servers' settings (flags, parser, context): never a client's."""
    max_lora_rank: int = 64
    """The largest LoRA rank a client may ask for (memory grows with it)."""

    def base_model_for(self, asked: Any) -> str:
        if asked is None:
            return self.base_models[0]
        if asked not in self.base_models:
            raise NotAllowedError(
                f"base model {asked!r} is not offered by this backend service; it offers {list(self.base_models)} "
                "(its operator adds others with `agentrl backend serve --base-model ...`)"
            )
        return str(asked)

    def check_server(self, asked: Any) -> None:
        server = ServerConfig.model_validate(asked)
        differing = [name for name in ServerConfig.model_fields if getattr(server, name) != getattr(self.server, name)]
        if differing:
            raise NotAllowedError(
                f"server settings {differing} differ from this backend service's: the operator fixes the inference "
                "server (`agentrl backend serve --server-config FILE`), and a client cannot change it; register "
                "without `server=` to use the service's"
            )


STATUS_OF: tuple[tuple[type[Exception] | tuple[type[Exception], ...], int], ...] = (
    (NotAllowedError, 403),
    ((StepConflictError, RunLockedError), 409),
    (BackendBrokenError, 503),
    ((ConfigurationError, ValidationError, TokenizationError, ValueError), 400),
)


def _status_of(error: Exception) -> int:
    return next((status for kinds, status in STATUS_OF if isinstance(error, kinds)), 500)


class BackendService:
    """The /backend/ routes over one `LocalBackend` whose runs live under `runs_dir`."""

    def __init__(
        self,
        runs_dir: Path,
        *,
        host: str,
        port: int,
        tokens: ServiceTokens,
        policy: OperatorPolicy | None = None,
        limits: GatewayLimits | None = None,
        **backend_options: Any,
    ) -> None:
        """`backend_options` go to `LocalBackend` (seed, trainer_device, trainer_ranks, shard_trainer)."""
        self.runs_dir = runs_dir
        self.instance = uuid.uuid4().hex
        self.tokens = tokens
        self.policy = policy or OperatorPolicy()
        self.limits = limits or GatewayLimits()
        self.models: dict[tuple[str, str], TrainableModel] = {}
        self._calls: set[asyncio.Task[Any]] = set()  # running calls, kept to their end if their client leaves
        self._step_requests: OrderedDict[tuple[str, str, str], asyncio.Task[Any]] = OrderedDict()
        self._model_locks: dict[tuple[str, str], asyncio.Lock] = {}
        self.backend = LocalBackend(
            host=host,
            port=port,
            token=tokens.sampling,
            admin_token=tokens.admin,
            routes=self.routes(),
            limits=self.limits,
            **backend_options,
        )

    def routes(self) -> list[Route]:
        return [
            Route("/backend/register", self._handler(RegisterRequest, self._register), methods=["POST"]),
            Route("/backend/get_step", self._handler(ModelRef, self._get_step), methods=["POST"]),
            Route("/backend/train", self._handler(TrainRequest, self._train), methods=["POST"]),
            Route("/backend/train_sft", self._handler(SFTRequest, self._train_sft), methods=["POST"]),
            Route("/backend/log", self._handler(LogRequest, self._log), methods=["POST"]),
            Route("/backend/delete_checkpoints", self._handler(DeleteRequest, self._delete), methods=["POST"]),
            Route("/backend/open_session", self._handler(SessionRequest, self._open_session), methods=["POST"]),
            Route("/backend/close_session", self._handler(SessionRequest, self._close_session), methods=["POST"]),
        ]

    def _handler(
        self, message: type[M], call: Callable[[M], Awaitable[Any]]
    ) -> Callable[[Request], Awaitable[Response]]:
        async def handle(request: Request) -> Response:
            headers = {SERVICE_HEADER: self.instance}
            stale = request.headers.get(SERVICE_HEADER)
            if stale is not None and stale != self.instance and message is not RegisterRequest:
                reply = ErrorReply(
                    type="ServiceRestarted",
                    message="the backend service restarted since this model registered, and its models with it; "
                    "call `await model.register(backend)` again to continue from the latest checkpoint",
                )
                return JSONResponse(reply.model_dump(), status_code=409, headers=headers)
            try:
                body = await read_body(request, self.limits.max_backend_body_bytes, self.limits.body_timeout_s)
                parsed = message.model_validate_json(body)
                task = asyncio.ensure_future(call(parsed))
                self._calls.add(task)
                task.add_done_callback(self._calls.discard)
                result = await asyncio.shield(task)  # a client that disconnects does not cut a step in half
            except RequestRefused as refused:
                reply = ErrorReply(type="RequestRefused", message=refused.message)
                return JSONResponse(reply.model_dump(), status_code=refused.status, headers=headers)
            except Exception as error:  # noqa: BLE001 - every failure goes back to the client, named
                if not isinstance(error, (AgentRLError, ValidationError)):
                    logger.exception("backend call %s failed", request.url.path)
                reply = ErrorReply(type=type(error).__name__, message=str(error))
                return JSONResponse(reply.model_dump(), status_code=_status_of(error), headers=headers)
            return JSONResponse(result, headers=headers)

        return handle

    def _model(self, ref: ModelRef) -> TrainableModel:
        model = self.models.get((ref.project, ref.name))
        if model is None:
            raise AgentRLError(
                f"model {ref.project}/{ref.name} is not registered on this backend service (it may have restarted); "
                "call `await model.register(backend)` first"
            )
        return model

    async def _register(self, request: RegisterRequest) -> dict[str, Any]:
        if unknown := sorted(set(request.model) - REGISTERED_FIELDS):
            raise ConfigurationError(
                f"register got fields this service does not take: {unknown}; a model registers with "
                f"{sorted(REGISTERED_FIELDS)} (its run folder is the service's own)"
            )
        fields = dict(request.model)
        fields["base_model"] = self.policy.base_model_for(fields.get("base_model"))
        if "server" in fields:
            self.policy.check_server(fields["server"])
        fields["server"] = self.policy.server
        model = TrainableModel.model_validate({**fields, "base_path": str(self.runs_dir)})
        if model.lora.rank > self.policy.max_lora_rank:
            raise NotAllowedError(
                f"LoRA rank {model.lora.rank} is above this backend service's most, {self.policy.max_lora_rank} "
                "(its operator sets it with `agentrl backend serve --max-lora-rank`)"
            )
        known = self.models.get((model.project, model.name))
        settings = set(REGISTERED_FIELDS)
        if known is not None and known.model_dump(include=settings) != model.model_dump(include=settings):
            raise ConfigurationError(
                f"model {model.project}/{model.name} is registered on this service with other settings "
                "(base model, LoRA or W&B); use those, or another name"
            )
        step = await self.backend.register(known or model)
        self.models[(model.project, model.name)] = known or model
        reply = RegisterReply(
            step=step,
            service=self.instance,
            sampling_token=self.tokens.sampling,
            base_model=model.base_model,
            spins_beside_cpu_server=self.backend.pipelined_spin_fix() is not None,
        )
        return reply.model_dump()

    async def _get_step(self, ref: ModelRef) -> dict[str, Any]:
        return StepReply(step=await self.backend.get_step(self._model(ref))).model_dump()

    async def _step_once(
        self, request: _StepRequest, ref: ModelRef, run: Callable[[TrainableModel], Awaitable[dict[str, Any]]]
    ) -> dict[str, Any]:
        """Run a step request once: a retry with the same id waits for (or returns) the first attempt's result;
        a failed attempt is forgotten, so its retry runs again (a failed step was rolled back)."""
        key = (ref.project, ref.name, request.request_id) if request.request_id else None
        if key is not None and (known := self._step_requests.get(key)) is not None:
            result: dict[str, Any] = await asyncio.shield(known)
            return result
        task = asyncio.ensure_future(self._at_step(ref, request.from_step, run))
        if key is not None:
            self._step_requests[key] = task
            while len(self._step_requests) > REMEMBERED_STEP_REQUESTS:
                self._step_requests.popitem(last=False)

            def forget_if_failed(done: asyncio.Task[Any]) -> None:
                if done.cancelled() or done.exception() is not None:
                    self._step_requests.pop(key, None)

            task.add_done_callback(forget_if_failed)
        result = await asyncio.shield(task)
        return result

    async def _at_step(
        self, ref: ModelRef, from_step: int | None, run: Callable[[TrainableModel], Awaitable[dict[str, Any]]]
    ) -> dict[str, Any]:
        """`run` while no other step of the model runs, if the model is still at `from_step`."""
        async with self._model_locks.setdefault((ref.project, ref.name), asyncio.Lock()):
            model = self._model(ref)
            step = await self.backend.get_step(model)
            if from_step is not None and from_step != step:
                raise StepConflictError(
                    f"model {ref.project}/{ref.name} is at step {step}, but this request was made at step {from_step}: "
                    "another client trained it since, or an earlier attempt of this request was applied. Nothing was "
                    f"trained; call `await model.get_step()` and train on groups sampled from {served_name(ref.name, step)}"
                )
            return await run(model)

    async def _train(self, request: TrainRequest) -> dict[str, Any]:
        async def run(model: TrainableModel) -> dict[str, Any]:
            result = await self.backend.train(
                model, request.groups, request.config, step_metrics=request.step_metrics, dropped=request.dropped
            )
            return dataclasses.asdict(result)

        return await self._step_once(request, request.model, run)

    async def _train_sft(self, request: SFTRequest) -> dict[str, Any]:
        async def run(model: TrainableModel) -> dict[str, Any]:
            return dataclasses.asdict(await self.backend.train_sft(model, request.histories, request.config))

        return await self._step_once(request, request.model, run)

    async def _log(self, request: LogRequest) -> dict[str, float]:
        return await self.backend.log(self._model(request.model), request.groups, request.split)

    async def _open_session(self, request: SessionRequest) -> dict[str, Any]:
        return {"session_id": await self.backend.open_session(self._model(request.model))}

    async def _close_session(self, request: SessionRequest) -> dict[str, Any]:
        if request.session_id is None:
            raise RequestRefused(400, "close_session needs the session_id that open_session returned")
        model = self._model(request.model)
        return {"exchanges": [list(e) for e in await self.backend.close_session(model, request.session_id)]}

    async def _delete(self, request: DeleteRequest) -> list[int]:
        model = self._model(request.model)
        return await self.backend.delete_checkpoints(model, keep_last=request.keep_last, best_by=request.best_by)


async def serve_backend(
    runs_dir: Path,
    *,
    host: str,
    port: int,
    policy: OperatorPolicy | None = None,
    limits: GatewayLimits | None = None,
    **backend_options: Any,
) -> None:
    """Run the service until interrupted: say where it listens and where its tokens are, then serve."""
    make_private_dir(runs_dir)
    tokens = service_tokens(runs_dir)
    service = BackendService(
        runs_dir, host=host, port=port, tokens=tokens, policy=policy, limits=limits, **backend_options
    )
    try:
        await service.backend.gateway.start()
        if tokens.generated:
            print(f"generated an admin token, saved (mode 0600) in {tokens.source}", flush=True)
        print(
            f"agentrl backend serving at {service.backend.gateway.root_url} (runs in {runs_dir}, admin token from "
            f"{tokens.source}; rollouts get the sampling token when a model registers; base models "
            f"{list(service.policy.base_models)})",
            flush=True,
        )
        await asyncio.Event().wait()
    finally:
        if service._calls:
            await asyncio.gather(*service._calls, return_exceptions=True)  # a step in progress ends whole
        await service.backend.close()
