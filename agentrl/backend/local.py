"""LocalBackend: the inference server, trainer and checkpoints of one or more models, on this machine.

Models of one base model share its `Engine` (vLLM server replicas, one trainer with an adapter per model) behind one
balancing gateway; each has its own `ModelSession` (run folder, lock, checkpoints, step). A step: (one GPU: the
server sleeps) -> the trainer updates the LoRA -> the checkpoint is written atomically -> the server loads it as
"{name}@{step}". The checkpoint is on disk before the server switches, so a crash at any point resumes from a
complete checkpoint the step counter agrees with; a failed update, wake-up, save or switch puts the trainer back to
the served checkpoint, so a retry applies exactly one step. A step that cannot train says why
(`TrainResult.skip_reason`). When the server died or a rollback failed, every call says so until the next `register`
rebuilds the engine from the checkpoints on disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from agentrl.backend.engine import Engine, start_engine
from agentrl.backend.run_lock import RunLock
from agentrl.backend.serving.replicas import ServerReplicas
from agentrl.backend.session import ModelSession, TrainerThread, open_session
from agentrl.backend.steps import grpo_step, updating
from agentrl.backend.training.adapter_trainer import AdapterTrainer, StepOutcome, train_sft
from agentrl.backend.training.placement import TrainerPlacement
from agentrl.backend.training.ranks.rank_hosts import JoinPoint
from agentrl.backend.training.step_input import StepInput
from agentrl.client.backend_protocol import TrainResult
from agentrl.client.model import Model
from agentrl.foundation.config import SFTConfig, TrainConfig
from agentrl.foundation.endpoint import InferenceEndpoint
from agentrl.foundation.errors import AgentRLError, BackendBrokenError, ConfigurationError
from agentrl.foundation.files import check_safe_name
from agentrl.foundation.openmp_spin import spin_fix_beside
from agentrl.gateway.limits import GatewayLimits
from agentrl.gateway.serve import Gateway
from agentrl.records.step_metrics import step_line
from agentrl.rl.tokenize import check_token_ids

if TYPE_CHECKING:
    from starlette.routing import BaseRoute

    from agentrl.client.model import TrainableModel
    from agentrl.data.trajectory import History
    from agentrl.data.trajectory_group import TrajectoryGroup

logger = logging.getLogger(__name__)


class LocalBackend:
    """Serves and trains `TrainableModel`s of one base model on this machine (vLLM + torch/peft).

    `trainer_device` ("cuda:1") puts the trainer on a GPU of its own: the server (on the first GPU) then keeps
    sampling while a step trains, which pipelined training needs. By default the trainer shares the server's
    device, and the server sleeps while it trains. `trainer_ranks` > 1 trains data-parallel in that many
    processes under `torch.distributed` (gloo on CPU, NCCL on GPUs from `trainer_device` up), each on its
    token-balanced share of a step; `shard_trainer` also shards the decoder layers over them (FSDP2), for a
    base model too large for one device (one model per backend then); `trainer_join` has some ranks join from
    other hosts (`agentrl backend rank --join`). `deterministic` trains with kernels that give the same bytes
    for the same input (slower on a GPU): a recorded step then replays bit for bit there. `host`, `port` and
    `token` say where its OpenAI-compatible gateway listens (by default a free port on loopback, with a token
    generated here: another user of a shared host can neither sample the adapters nor read their tokens).
    `admin_token` opens `routes` (a backend service's own); `limits` bound what one request may ask;
    `join_token` lets inference replicas on other hosts join its gateway (`agentrl backend replica --join`).
    """

    def __init__(
        self,
        *,
        seed: int = 0,
        trainer_device: str | None = None,
        trainer_ranks: int = 1,
        shard_trainer: bool = False,
        trainer_join: JoinPoint | None = None,
        deterministic: bool = False,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        admin_token: str | None = None,
        routes: Sequence[BaseRoute] = (),
        limits: GatewayLimits | None = None,
        join_token: str | None = None,
    ) -> None:
        self.placement = TrainerPlacement(
            seed, trainer_device, trainer_ranks, shard_trainer, deterministic, trainer_join
        )
        """Where the trainer runs (a `ConfigurationError` here for ranks that cannot be)."""
        self.sessions: dict[str, ModelSession] = {}
        """Registered models by run folder."""
        self._sampling_token = token or secrets.token_urlsafe(32)
        """What clients send as their API key: the gateway's sampling token (given, or generated here)."""
        self.gateway = Gateway(
            host=host,
            port=port,
            token=self._sampling_token,
            admin_token=admin_token,
            routes=routes,
            limits=limits,
            join_token=join_token,
        )
        """The OpenAI-compatible door to the server, for any client; rollouts sample through it."""
        self._engine: Engine | None = None  # started by the first register
        self._broken: str | None = None  # why the engine can no longer be trusted; the next register rebuilds it
        self._starting = asyncio.Lock()
        self._trainer_thread = TrainerThread()

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            raise AgentRLError("the backend has no server yet; register a model first")
        return self._engine

    @property
    def server(self) -> ServerReplicas:
        """The vLLM server replicas (an error before the first `register`)."""
        return self.engine.server

    @property
    def trainer(self) -> AdapterTrainer:
        """The trainer (or its ranks), one adapter per registered model (an error before the first `register`)."""
        return self.engine.trainer

    def session(self, model: TrainableModel) -> ModelSession:
        """The registered `model`'s state on this backend (an error naming the fix if it is not registered)."""
        if self._broken is not None:
            raise BackendBrokenError(self._broken)
        session = self.sessions.get(str(model.run_dir.resolve()))
        if session is None:
            raise AgentRLError(
                f"model {model.project}/{model.name} is not registered on this backend; "
                "call `await model.register(backend)` first"
            )
        return session

    def endpoint(self, model: TrainableModel) -> InferenceEndpoint:
        """The gateway's address and token, how to tell that the server died, and what it logged last."""
        server = self.server
        return InferenceEndpoint(self.gateway.base_url, self._sampling_token, server.death_notice, server.recent_log)

    async def open_session(self, model: TrainableModel) -> str:
        self.session(model)  # registered, or an error naming the fix
        return self.gateway.sessions.open()

    async def close_session(
        self, model: TrainableModel, session_id: str
    ) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        return self.gateway.sessions.close(session_id)

    @property
    def base_url(self) -> str:
        """The gateway's OpenAI-compatible root, where every registered model and "base" are served."""
        self.engine  # noqa: B018 - an error before register
        return self.gateway.base_url

    def base_model(self) -> Model:
        """The untrained base model on this server (always served as "base"): a prompted baseline, or
        a local judge through litellm's hosted_vllm route, so the adapter never judges its own work."""
        return Model(name="base", base_url=self.base_url, api_key=self._sampling_token, litellm_provider="hosted_vllm")

    def pipelined_spin_fix(self) -> str | None:
        """`ReportsSpinning`: the trainer is in this process, beside a server on the CPU unless on a GPU."""
        return spin_fix_beside(server_on_cpu=not self.server.gpu)

    def pipelined_cores(self) -> contextlib.AbstractAsyncContextManager[bool]:
        """`ReportsSpinning`: with that fix missing, the trainer (in this process, no ranks) computes on one thread."""
        return self._trainer_thread.one_thread_while(bool(self.pipelined_spin_fix()) and self.placement.ranks == 1)

    async def register(self, model: TrainableModel) -> int:
        """Lock the run folder, resume `model` from its latest valid checkpoint (or create step 0), serve it.

        Registering a model whose run is already registered here returns its step (after any step in
        progress), so a client that reconnects continues where the run is."""
        if (why := self._why_rebuild()) is not None:
            await self._drop_engine(why)
        key = str(model.run_dir.resolve())
        if (session := self.sessions.get(key)) is not None:
            async with session.busy:
                return session.step
        if clash := [s.model.run_dir for s in self.sessions.values() if s.model.name == model.name]:
            raise ConfigurationError(
                f"model name {model.name!r} is already served here for the run in {clash[0]}: clients send the name as "
                f"`model=`, so two runs under one name cannot both be served; give this run ({model.run_dir}) a "
                "different `name`"
            )
        lock = RunLock(model.run_dir)
        lock.acquire()  # before anything touches the folder: another process may be mid-save
        try:
            async with self._starting:
                engine = await self._start_engine(model)
                adapter = "default" if not self.sessions else f"model{len(self.sessions)}"
                session = await open_session(model, adapter, lock, engine.trainer, engine.server, self._trainer_thread)
                where = (session.served_name(), session.store.path(session.step), self.gateway.base_url)
                logger.info("serving %s from %s at %s", *where)
        except BaseException:
            lock.release()
            if not self.sessions:  # a half-started backend leaves no server behind
                await self._stop_engine()
            raise
        self.sessions[key] = session
        return session.step

    async def _start_engine(self, model: TrainableModel) -> Engine:
        """The server, gateway and trainer for `model`'s base model (started by the first register)."""
        if self._engine is not None:
            self._engine.check_fits(model)
            return self._engine
        self._engine = engine = await start_engine(model, self.placement, self._trainer_thread)
        await self.gateway.start()
        server = engine.server
        self.gateway.connect(
            server.gateway_replicas(), drop_seed=not server.gpu, context=model.server.max_model_len, door=server
        )
        return engine

    async def get_step(self, model: TrainableModel) -> int:
        return self.session(model).step

    async def train(
        self,
        model: TrainableModel,
        groups: list[TrajectoryGroup],
        config: TrainConfig,
        *,
        step_metrics: dict[str, float] | None = None,
        dropped: Sequence[TrajectoryGroup] = (),
    ) -> TrainResult:
        """One GRPO step; the server serves the new checkpoint when it returns."""
        if bad := sorted(k for k, v in (step_metrics or {}).items() if not math.isfinite(v)):
            raise ConfigurationError(f"step_metrics {bad} are not finite numbers; record only finite values")
        session = self.session(model)
        async with session.busy, self._keeps_breakage():
            return await self._train(session, groups, config, dict(step_metrics or {}), list(dropped))

    async def _train(
        self,
        session: ModelSession,
        groups: list[TrajectoryGroup],
        config: TrainConfig,
        step_metrics: dict[str, float],
        dropped: list[TrajectoryGroup],
    ) -> TrainResult:
        async def update(trainable: list[TrajectoryGroup], config: TrainConfig) -> StepOutcome:
            async with self._updating(session):
                return await self._trainer_thread.run(self.trainer.train_step, session.adapter, trainable, config)

        return await grpo_step(
            session,
            groups,
            config,
            step_metrics,
            dropped=dropped,
            store=self.gateway.store,
            vocab_size=self.engine.vocab_size,
            update=update,
        )

    @property
    def shares_a_device(self) -> bool:
        """Whether the trainer trains on a GPU the servers sample on (the default on a GPU host): then the
        servers sleep while a step trains, and nothing samples meanwhile (no pipelining on one GPU).
        The servers take cuda:0 up to their device count; trainer ranks above them have their own."""
        device = self.placement.device or "cuda:0"
        index = int(device.partition(":")[2] or 0) if device.startswith("cuda") else 0  # parsed on a GPU only
        return device.startswith("cuda") and (self._engine is None or index < self._engine.server.devices)

    def _updating(self, session: ModelSession) -> contextlib.AbstractAsyncContextManager[None]:
        return updating(session, self.server if self.shares_a_device else None, lambda: self._next_move(session))

    async def train_sft(self, model: TrainableModel, histories: list[History], config: SFTConfig) -> TrainResult:
        """Supervised steps on demonstrations (their assistant messages are the targets), then one checkpoint."""
        session = self.session(model)
        check_token_ids(((f"demonstration {i}", h) for i, h in enumerate(histories)), self.engine.vocab_size)
        async with session.busy, self._keeps_breakage():
            async with self._updating(session):
                outcome = await self._trainer_thread.run(train_sft, self.trainer, session.adapter, histories, config)
            trained_on = (
                StepInput([], config, outcome.conditions, histories) if outcome.conditions is not None else None
            )
            return await session.commit(outcome, split="sft", groups=[], step_input=trained_on)

    @contextlib.asynccontextmanager
    async def _keeps_breakage(self) -> AsyncIterator[None]:
        """Keep why the backend broke (a rollback that failed), so every later call says so until a register rebuilds it."""
        try:
            yield
        except BackendBrokenError as error:
            self._broken = str(error)
            raise

    async def log(self, model: TrainableModel, groups: list[TrajectoryGroup], split: str) -> dict[str, float]:
        """Record evaluation groups at the current step: metrics line, trajectories, transcript, plot."""
        check_safe_name(split, "split")  # it names files in the run folder: no path may come through it
        session = self.session(model)
        metrics = step_line({}, groups, None)
        await session.record(groups, metrics, step=session.step, split=split)
        return metrics

    async def delete_checkpoints(self, model: TrainableModel, *, keep_last: int, best_by: str | None) -> list[int]:
        """Delete all but the last `keep_last` checkpoints and the best by `best_by` ("split/metric")."""
        return await self.session(model).delete_checkpoints(keep_last=keep_last, best_by=best_by)

    def _next_move(self, session: ModelSession) -> str:
        """What a caller does after a failed step that was rolled back to the served checkpoint."""
        if self._why_rebuild() is not None:
            return (
                f"the trainer is back at checkpoint {session.step}, but the inference server died. Register the model "
                "again: the backend then restarts its server and trainer from the checkpoints on disk"
            )
        return f"the trainer is back at checkpoint {session.step}, which is still served; call train again"

    def _why_rebuild(self) -> str | None:
        """Why the engine must be rebuilt before it serves again (a failed rollback, every server dead); None if not."""
        if self._engine is None:
            return None
        if self._broken is not None:
            return self._broken
        if (notice := self._engine.server.death_notice()) is not None:
            return f"the inference server died: {notice}"
        return None

    async def _drop_engine(self, why: str) -> None:
        """Stop the server and trainer and forget every model (their runs stay on disk); the gateway keeps
        listening, and the next register starts a new engine that resumes from the checkpoints."""
        logger.warning("rebuilding the backend's server and trainer; registered models must register again: %s", why)
        await self._stop_engine(keep_gateway=True)
        await self._release_sessions()
        self._broken = None

    async def _stop_engine(self, *, keep_gateway: bool = False) -> None:
        if keep_gateway:
            self.gateway.connect([])
        else:
            await self.gateway.stop()
        engine, self._engine = self._engine, None
        if engine is not None:
            await engine.stop()

    async def _release_sessions(self) -> None:
        for session in self.sessions.values():
            if session.wandb is not None:
                await asyncio.to_thread(session.wandb.finish)
            session.lock.release()
        self.sessions.clear()

    async def close(self) -> None:
        """Stop the gateway and the server, finish W&B runs and release the run folders."""
        await self._stop_engine()
        await self._release_sessions()
        self._trainer_thread.shutdown()

    async def __aenter__(self) -> LocalBackend:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
