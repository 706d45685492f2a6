"""`agentrl backend serve`: a LocalBackend and its gateway as a service that `RemoteBackend` drives over HTTP.

One port serves both the OpenAI-compatible gateway (/v1/...) that rollouts sample from and the
backend's own routes (/backend/...) for register, train, log and the rest; a bearer token guards
every route. A step runs to its end even if the client that asked for it disconnects, so a client
killed mid-train leaves the run at the old step or the new one, never between; a new client
registering the same model continues from there.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import secrets
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from agentrl.backend.local import LocalBackend
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
    StepReply,
    TrainRequest,
)
from agentrl.errors import AgentRLError, ConfigurationError, RunLockedError
from agentrl.files import write_text_atomic
from agentrl.model import TrainableModel

logger = logging.getLogger(__name__)
TOKEN_FILE = "backend.token"
M = TypeVar("M", bound=BaseModel)


def service_token(runs_dir: Path) -> tuple[str, str, bool]:
    """The service's token, where it came from, and whether it was just generated: `AGENTRL_TOKEN`, else
    the one saved beside the runs ({runs_dir}/backend.token, mode 0600), else a new one saved there."""
    if token := os.environ.get(TOKEN_ENV, "").strip():
        return token, TOKEN_ENV, False
    path = runs_dir / TOKEN_FILE
    if path.exists():
        token = path.read_text().strip()
        if token:
            return token, str(path), False
    token = secrets.token_urlsafe(32)
    write_text_atomic(path, token + "\n", mode=0o600)
    return token, str(path), True


def _status_of(error: Exception) -> int:
    if isinstance(error, (ConfigurationError, ValidationError, ValueError)):
        return 400
    if isinstance(error, RunLockedError):
        return 409
    return 500


class BackendService:
    """The /backend/ routes over one `LocalBackend` whose runs live under `runs_dir`."""

    def __init__(
        self,
        runs_dir: Path,
        *,
        host: str,
        port: int,
        token: str,
        **backend_options: Any,
    ) -> None:
        """`backend_options` go to `LocalBackend` (seed, trainer_device, trainer_ranks, shard_trainer)."""
        self.runs_dir = runs_dir
        self.instance = uuid.uuid4().hex
        self.models: dict[tuple[str, str], TrainableModel] = {}
        self._calls: set[asyncio.Task[Any]] = set()  # running calls, kept to their end if their client leaves
        self.backend = LocalBackend(host=host, port=port, token=token, routes=self.routes(), **backend_options)

    def routes(self) -> list[Route]:
        return [
            Route("/backend/register", self._handler(RegisterRequest, self._register), methods=["POST"]),
            Route("/backend/get_step", self._handler(ModelRef, self._get_step), methods=["POST"]),
            Route("/backend/train", self._handler(TrainRequest, self._train), methods=["POST"]),
            Route("/backend/train_sft", self._handler(SFTRequest, self._train_sft), methods=["POST"]),
            Route("/backend/log", self._handler(LogRequest, self._log), methods=["POST"]),
            Route("/backend/delete_checkpoints", self._handler(DeleteRequest, self._delete), methods=["POST"]),
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
                parsed = message.model_validate_json(await request.body())
                task = asyncio.ensure_future(call(parsed))
                self._calls.add(task)
                task.add_done_callback(self._calls.discard)
                result = await asyncio.shield(task)  # a client that disconnects does not cut a step in half
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
        fields = {k: v for k, v in request.model.items() if k in REGISTERED_FIELDS}
        model = TrainableModel.model_validate({**fields, "base_path": str(self.runs_dir)})
        known = self.models.get((model.project, model.name))
        settings = set(REGISTERED_FIELDS)
        if known is not None and known.model_dump(include=settings) != model.model_dump(include=settings):
            raise ConfigurationError(
                f"model {model.project}/{model.name} is registered on this service with other settings "
                "(base model, LoRA, server or W&B); use those, or another name"
            )
        step = await self.backend.register(known or model)
        self.models[(model.project, model.name)] = known or model
        return {"step": step, "service": self.instance}

    async def _get_step(self, ref: ModelRef) -> dict[str, Any]:
        return StepReply(step=await self.backend.get_step(self._model(ref))).model_dump()

    async def _train(self, request: TrainRequest) -> dict[str, Any]:
        model = self._model(request.model)
        result = await self.backend.train(model, request.groups, request.config, step_metrics=request.step_metrics)
        return dataclasses.asdict(result)

    async def _train_sft(self, request: SFTRequest) -> dict[str, Any]:
        result = await self.backend.train_sft(self._model(request.model), request.histories, request.config)
        return dataclasses.asdict(result)

    async def _log(self, request: LogRequest) -> dict[str, float]:
        return await self.backend.log(self._model(request.model), request.groups, request.split)

    async def _delete(self, request: DeleteRequest) -> list[int]:
        model = self._model(request.model)
        return await self.backend.delete_checkpoints(model, keep_last=request.keep_last, best_by=request.best_by)


async def serve_backend(
    runs_dir: Path,
    *,
    host: str,
    port: int,
    **backend_options: Any,
) -> None:
    """Run the service until interrupted: print where it listens (and a new token, once), then serve."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    token, source, generated = service_token(runs_dir)
    service = BackendService(runs_dir, host=host, port=port, token=token, **backend_options)
    try:
        await service.backend.gateway.start()
        if generated:
            print(f"generated a token, saved (mode 0600) in {runs_dir / TOKEN_FILE}:\n  {token}", flush=True)
        print(
            f"agentrl backend serving at {service.backend.gateway.root_url} (runs in {runs_dir}, token from {source})",
            flush=True,
        )
        await asyncio.Event().wait()
    finally:
        if service._calls:
            await asyncio.gather(*service._calls, return_exceptions=True)  # a step in progress ends whole
        await service.backend.close()
