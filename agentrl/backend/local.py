"""LocalBackend: the inference server, trainer and checkpoints of one or more models, on this machine.

Models of one base model share its vLLM servers (each served as "{name}@{step}", the base model as
"base"; `ServerConfig.replicas` of them), one gateway in front balancing over them, and one
trainer (one LoRA adapter and optimizer per model);
each has its own run folder, lock, checkpoints and step. A training step, in order: (one GPU: the
server sleeps) -> the trainer updates the LoRA -> the new checkpoint is written atomically -> the
server loads it as "{name}@{step}" and drops the adapter before the previous one. The checkpoint is on disk before the server switches, so a crash at any point resumes
from a complete checkpoint that the step counter agrees with. A save or a switch that fails puts
the trainer back to the last served checkpoint, so a retry applies exactly one step; so does a
failure of the update itself or of the server's wake-up after it. A step that cannot train (see
`agentrl.rl.screen`) says why in `TrainResult.skip_reason`. When the server died or a rollback failed,
the backend is broken: every call says so, and the next `register` rebuilds the server and trainer
from the checkpoints on disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import math
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from tqdm.auto import tqdm

from agentrl.backend.checkpoints import CheckpointStore
from agentrl.backend.protocol import InferenceEndpoint
from agentrl.backend.ranks import TrainerRanks
from agentrl.backend.replicas import ServerReplicas
from agentrl.backend.run_lock import RunLock
from agentrl.backend.trainer import AdapterTrainer, StepOutcome, Trainer
from agentrl.base_models import resolve_base_model
from agentrl.config import SFTConfig, TrainConfig
from agentrl.errors import AgentRLError, BackendBrokenError, CheckpointError, ConfigurationError, ServerError
from agentrl.files import check_safe_name
from agentrl.gateway.limits import GatewayLimits
from agentrl.gateway.serve import Gateway
from agentrl.gateway.store import fill_sampled_tokens
from agentrl.model import TrainResult, served_name
from agentrl.rl.screen import judge_failure_error, screen_groups, skip_reason
from agentrl.rl.tokenize import check_token_ids, labelled_histories
from agentrl.run_folder import RunFolder
from agentrl.tracking import DEFAULT_BEST_BY, best_step, record_step, summarize, with_art_names
from agentrl.wandb_metrics import WandbMetrics, wandb_requested

if TYPE_CHECKING:
    from starlette.routing import BaseRoute

    from agentrl.model import Model, TrainableModel
    from agentrl.trajectory import History, TrajectoryGroup

logger = logging.getLogger(__name__)
T = TypeVar("T")

SERVED_ADAPTERS = 2
"""Adapters kept loaded per model: the new one and the one before, so a request that named the old
adapter just before a swap (a pipelined rollout's next turn) is still answered, by the adapter it named."""


@dataclass
class _Engine:
    """What the models of a backend share: the base model, its vLLM servers and the trainer."""

    base_model: str
    model_path: str
    server: ServerReplicas
    trainer: AdapterTrainer
    vocab_size: int
    """Token ids a client may send for training lie in [0, vocab_size)."""


@dataclass
class ModelSession:
    """One registered model on a backend: its run folder's lock, checkpoints, trainer adapter and step."""

    model: TrainableModel
    adapter: str
    """The trainer's name for this model's LoRA adapter."""
    store: CheckpointStore
    lock: RunLock
    step: int = 0
    wandb: WandbMetrics | None = None
    served: list[int] = field(default_factory=list)
    """Steps whose adapters the server holds, oldest first (the last `SERVED_ADAPTERS`)."""
    busy: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Held by a call that changes the step (train, train_sft), so one runs at a time per model."""

    def served_name(self, step: int | None = None) -> str:
        return served_name(self.model.name, self.step if step is None else step)


class LocalBackend:
    """Serves and trains `TrainableModel`s of one base model on this machine (vLLM + torch/peft).

    `trainer_device` ("cuda:1") puts the trainer on a GPU of its own: the server (on the first GPU)
    then keeps sampling while a step trains, which pipelined training needs. By default the trainer
    shares the server's device, and the server sleeps while it trains.
    `trainer_ranks` > 1 trains data-parallel in that many processes under `torch.distributed` (gloo
    on CPU, NCCL on GPUs from `trainer_device` up), each on its token-balanced share of a step;
    `shard_trainer` also shards the decoder layers over them (FSDP2), for a base model too large
    for one device (one model per backend then).
    `host`, `port` and `token` say where its OpenAI-compatible gateway listens (by default a free
    port on loopback, with a token generated here: another user of a shared host can neither sample
    the adapters nor read their tokens). `admin_token` opens `routes` (a backend service's own);
    `limits` bound what one request may ask (`GatewayLimits`).
    """

    def __init__(
        self,
        *,
        seed: int = 0,
        trainer_device: str | None = None,
        trainer_ranks: int = 1,
        shard_trainer: bool = False,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        admin_token: str | None = None,
        routes: Sequence[BaseRoute] = (),
        limits: GatewayLimits | None = None,
    ) -> None:
        if trainer_ranks < 1:
            raise ConfigurationError(f"trainer_ranks must be 1 or more, got {trainer_ranks}")
        if shard_trainer and trainer_ranks < 2:
            raise ConfigurationError(
                "shard_trainer shards the model over trainer ranks: set trainer_ranks to 2 or more"
            )
        self.seed = seed
        self.trainer_device = trainer_device
        self.trainer_ranks = trainer_ranks
        self.shard_trainer = shard_trainer
        self.sessions: dict[str, ModelSession] = {}
        """Registered models by run folder."""
        self._sampling_token = token or secrets.token_urlsafe(32)
        self.gateway = Gateway(
            host=host,
            port=port,
            token=self._sampling_token,
            admin_token=admin_token,
            routes=routes,
            limits=limits,
        )
        """The OpenAI-compatible door to the server, for any client; rollouts sample through it."""
        self._engine: _Engine | None = None  # started by the first register
        self._broken: str | None = None  # why the engine can no longer be trusted; the next register rebuilds it
        self._starting = asyncio.Lock()
        # Every trainer call runs on this one thread. Spread over a pool's threads, torch's
        # allocations land in several glibc malloc arenas that never share freed memory: measured
        # here, peak RSS grew to 13.6 GB over three steps instead of holding at 6.3 GB.
        self._trainer_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentrl-trainer")

    async def _on_trainer_thread(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(
            self._trainer_thread, functools.partial(fn, *args, **kwargs)
        )

    @property
    def engine(self) -> _Engine:
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
        """The gateway's address and token, and how to tell that the server died."""
        return InferenceEndpoint(self.gateway.base_url, self._client_key, death_notice=self.server.death_notice)

    async def open_session(self, model: TrainableModel) -> str:
        self.session(model)  # registered, or an error naming the fix
        return self.gateway.sessions.open()

    async def close_session(
        self, model: TrainableModel, session_id: str
    ) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        return self.gateway.sessions.close(session_id)

    @property
    def _client_key(self) -> str:
        """What clients send as their API key: the gateway's sampling token (given, or generated here)."""
        return self._sampling_token

    @property
    def base_url(self) -> str:
        """The gateway's OpenAI-compatible root, where every registered model and "base" are served."""
        self.engine  # noqa: B018 - an error before register
        return self.gateway.base_url

    def base_model(self) -> Model:
        """The untrained base model on this server (always served as "base"): a prompted baseline, or
        a local judge through litellm's hosted_vllm route, so the adapter never judges its own work."""
        from agentrl.model import Model

        return Model(name="base", base_url=self.base_url, api_key=self._client_key, litellm_provider="hosted_vllm")

    async def register(self, model: TrainableModel) -> int:
        """Lock the run folder, resume `model` from its latest valid checkpoint (or create step 0), serve it.

        Registering a model whose run is already registered here returns its step (after any step in
        progress), so a client that reconnects continues where the run is.
        """
        if (why := self._why_rebuild()) is not None:
            await self._drop_engine(why)
        key = str(model.run_dir.resolve())
        if (session := self.sessions.get(key)) is not None:
            async with session.busy:
                return session.step
        lock = RunLock(model.run_dir)
        lock.acquire()  # before anything touches the folder: another process may be mid-save
        try:
            async with self._starting:
                engine = await self._start_engine(model)
                session = await self._open_session(model, engine, lock)
        except BaseException:
            lock.release()
            if not self.sessions:  # a half-started backend leaves no server behind
                await self._stop_engine()
            raise
        self.sessions[key] = session
        return session.step

    async def _start_engine(self, model: TrainableModel) -> _Engine:
        """The server, gateway and trainer for `model`'s base model (started by the first register)."""
        if self._engine is not None:
            engine = self._engine
            if model.base_model != engine.base_model:
                raise ConfigurationError(
                    f"this backend serves base model {engine.base_model!r}; model {model.name!r} asks for "
                    f"{model.base_model!r}. Models of one backend share one base model: use another LocalBackend"
                )
            if model.lora.rank > engine.server.max_lora_rank:
                raise ConfigurationError(
                    f"model {model.name!r} has LoRA rank {model.lora.rank}, above the server's max_lora_rank "
                    f"{engine.server.max_lora_rank} (set by the first model registered); register the model with "
                    "the largest rank first"
                )
            return engine
        model_path = await self._on_trainer_thread(resolve_base_model, model.base_model)
        vocab_size = await self._on_trainer_thread(_vocab_size, model_path)
        server = ServerReplicas(model_path, RunFolder(model.run_dir).logs, model.server, max_lora_rank=model.lora.rank)
        # On a CPU the server spends its start importing, one core at a time: the trainer loads meanwhile
        # (~6 s of a 2-core float32 machine's ~40 s start). On a GPU vLLM sizes its memory from what is
        # free as it starts, so there the trainer loads first.
        starting = None if server.gpu else asyncio.ensure_future(server.start())
        trainer: AdapterTrainer
        try:
            if self.trainer_ranks > 1:
                trainer = await self._on_trainer_thread(
                    TrainerRanks,
                    model_path,
                    ranks=self.trainer_ranks,
                    seed=self.seed,
                    device=self.trainer_device,
                    sharded=self.shard_trainer,
                )
            else:
                trainer = await self._on_trainer_thread(Trainer, model_path, seed=self.seed, device=self.trainer_device)
        except BaseException:
            if starting is not None:
                starting.cancel()
                await asyncio.gather(starting, return_exceptions=True)
                await asyncio.to_thread(server.stop)
            raise
        self._engine = _Engine(model.base_model, model_path, server, trainer, vocab_size)
        await (starting if starting is not None else server.start())
        await self.gateway.start()
        self.gateway.connect(server.gateway_replicas(), drop_seed=not server.gpu, context=model.server.max_model_len)
        return self._engine

    async def _open_session(self, model: TrainableModel, engine: _Engine, lock: RunLock) -> ModelSession:
        adapter = "default" if not self.sessions else f"model{len(self.sessions)}"
        await self._on_trainer_thread(engine.trainer.add_adapter, adapter, model.lora)
        store = CheckpointStore(model.run_dir)
        store.sweep_staging()
        session = ModelSession(model, adapter, store, lock)
        session.step = await self._on_trainer_thread(self._resume, session)
        if wandb_requested(model.wandb):
            config = model.model_dump(mode="json", include={"base_model", "lora", "server"})
            session.wandb = await asyncio.to_thread(
                WandbMetrics, model.run_dir, project=model.project, name=model.name, config=config
            )
        await engine.server.load_adapter(session.served_name(), store.path(session.step))
        session.served.append(session.step)
        logger.info("serving %s from %s at %s", session.served_name(), store.path(session.step), self.gateway.base_url)
        return session

    def _resume(self, session: ModelSession) -> int:
        """Load the newest checkpoint that validates; move the ones that do not aside. Runs on the trainer thread."""
        store, trainer = session.store, self.trainer
        steps = store.steps()
        for step in reversed(steps):
            try:
                store.info(step)
                trainer.load(session.adapter, store.path(step))
                return step
            except CheckpointError as error:
                aside = store.move_aside(step, str(error))
                logger.warning("checkpoint %d is corrupt and was moved aside to %s: %s", step, aside, error)
        if steps:
            logger.warning("no valid checkpoint left in %s: starting again from an untrained adapter", store.root)
        store.save(0, functools.partial(trainer.save, session.adapter), {"metrics": {}})
        return 0

    async def get_step(self, model: TrainableModel) -> int:
        return self.session(model).step

    async def train(
        self,
        model: TrainableModel,
        groups: list[TrajectoryGroup],
        config: TrainConfig,
        *,
        step_metrics: dict[str, float] | None = None,
    ) -> TrainResult:
        """One GRPO step; the server serves the new checkpoint when it returns."""
        if bad := sorted(k for k, v in (step_metrics or {}).items() if not math.isfinite(v)):
            raise ConfigurationError(f"step_metrics {bad} are not finite numbers; record only finite values")
        session = self.session(model)
        async with session.busy:
            return await self._train(session, groups, config, dict(step_metrics or {}))

    async def _train(
        self, session: ModelSession, groups: list[TrajectoryGroup], config: TrainConfig, step_metrics: dict[str, float]
    ) -> TrainResult:
        trainer = self.trainer
        groups = fill_sampled_tokens(groups, self.gateway.store)  # Choices that kept only their completion id
        check_token_ids(labelled_histories(groups), self.engine.vocab_size)  # before any of it reaches the trainer
        screened = screen_groups(groups)  # raises RewardError for a missing or non-finite reward
        if (error := judge_failure_error(screened, config.max_judge_failure_rate)) is not None:
            raise error
        if screened.num_judge_failed:
            logger.warning(
                "judge failures dropped %d of %d groups this step; last judge error: %s",
                screened.num_judge_failed,
                screened.num_given,
                screened.last_judge_error,
            )
        if screened.trainable:
            async with self._updating(session):
                outcome = await self._on_trainer_thread(trainer.train_step, session.adapter, screened.trainable, config)
        else:
            outcome = StepOutcome(updated=False)
        reason = None
        if not outcome.updated:
            num_zero_variance = round(outcome.metrics.get("frac_zero_variance_groups", 0.0) * len(screened.trainable))
            reason = skip_reason(
                screened,
                num_zero_variance=num_zero_variance,
                num_skipped_trajectories=int(outcome.metrics.get("num_skipped_trajectories", 0)),
            )
            logger.warning(
                "%s: step %d skipped, the step counter stays at %d: %s",
                session.model.name,
                session.step + 1,
                session.step,
                reason,
            )
        metrics = {**step_metrics, **outcome.metrics, **screened.metrics()}
        result = await self._commit(session, StepOutcome(outcome.updated, metrics), split="train", groups=list(groups))
        return dataclasses.replace(result, skip_reason=reason, last_judge_error=screened.last_judge_error)

    @property
    def shares_a_device(self) -> bool:
        """Whether the trainer trains on a GPU the servers sample on (the default on a GPU host): then the
        servers sleep while a step trains, and nothing samples meanwhile (no pipelining on one GPU).
        The servers take cuda:0 up to their device count; trainer ranks above them have their own."""
        device = self.trainer_device or "cuda:0"
        if not device.startswith("cuda"):
            return False
        index = int(device.partition(":")[2] or 0)
        return self._engine is None or index < self._engine.server.devices

    @contextlib.asynccontextmanager
    async def _updating(self, session: ModelSession) -> AsyncIterator[None]:
        """The server asleep (one GPU) while the trainer changes `session`'s adapter. If the update or the
        wake-up after it fails, the adapter and optimizer go back to the served checkpoint before the error
        is raised, so nothing of the failed step stays in the trainer and a retry applies exactly one step."""
        try:
            if self.shares_a_device:
                await self.server.sleep()
            yield
            if self.shares_a_device:
                await self.server.wake_up()
        except Exception as error:
            await self._roll_back(session, session.step, f"the update failed before it was saved ({error})")
            if self.shares_a_device:
                with contextlib.suppress(Exception):  # best effort: the error below says what went wrong
                    await self.server.wake_up()
            if isinstance(error, AgentRLError):
                raise type(error)(f"{error}. Nothing of this step was applied: {self._next_move(session)}") from error
            raise

    async def train_sft(self, model: TrainableModel, histories: list[History], config: SFTConfig) -> TrainResult:
        """Supervised steps on demonstrations (their assistant messages are the targets), then one checkpoint."""
        session = self.session(model)
        check_token_ids(((f"demonstration {i}", h) for i, h in enumerate(histories)), self.engine.vocab_size)
        async with session.busy:
            metrics: dict[str, float] = {}
            starts = range(0, len(histories), config.batch_size)
            progress = tqdm(total=config.epochs * len(starts), desc="sft", unit="batch")
            try:
                async with self._updating(session):
                    for epoch in range(config.epochs):
                        for start in starts:
                            outcome = await self._on_trainer_thread(
                                self.trainer.sft_step,
                                session.adapter,
                                histories[start : start + config.batch_size],
                                learning_rate=config.learning_rate,
                                micro_batch_tokens=config.micro_batch_tokens,
                                shared_prefix=config.shared_prefix,
                            )
                            metrics = {**outcome.metrics, "epoch": float(epoch)}
                            progress.set_postfix(loss=f"{metrics.get('sft_loss', float('nan')):.3f}", refresh=False)
                            progress.update(1)
            finally:
                progress.close()
            return await self._commit(session, StepOutcome(bool(metrics), metrics), split="sft", groups=[])

    async def _commit(
        self, session: ModelSession, outcome: StepOutcome, *, split: str, groups: list[TrajectoryGroup]
    ) -> TrainResult:
        """Checkpoint the model's adapter as its next step and serve it; or record a skipped step.

        If the save or the switch fails, the adapter goes back to the last served checkpoint (an
        unserved new checkpoint is moved aside, not deleted, and unloaded from every replica that took
        it) and the error says so: the step did not happen, and calling train again applies exactly one
        step. Once the new checkpoint is served the step is committed: a failure to record its metrics
        is reported in `TrainResult.record_error`, never raised (a retry would apply a second step).
        """
        store, server = session.store, self.server
        metrics = dict(outcome.metrics)
        if not outcome.updated:
            recording = self._record(session, groups, metrics, step=session.step, split=split, skipped=True)
            record_error = await self._record_committed(recording, session.step)
            return TrainResult(step=session.step, metrics=metrics, skipped=True, record_error=record_error)
        new_step, old_step = session.step + 1, session.step
        started = time.perf_counter()
        save = functools.partial(self.trainer.save, session.adapter)
        try:
            await self._on_trainer_thread(store.save, new_step, save, {"metrics": metrics})
        except Exception as error:
            why = f"saving checkpoint {new_step} failed ({type(error).__name__}: {error})"
            await self._roll_back(session, old_step, why)
            raise CheckpointError(
                f"saving checkpoint {new_step} to {store.path(new_step)} failed: {type(error).__name__}: {error}. The "
                f"step was rolled back (the trainer is at checkpoint {old_step} again, still served): free disk space "
                "or fix the folder, then call train again"
            ) from error
        metrics["save_s"] = time.perf_counter() - started
        started = time.perf_counter()
        try:
            await server.load_adapter(session.served_name(new_step), store.path(new_step))
        except Exception as error:
            why = f"the server could not load checkpoint {new_step} ({type(error).__name__}: {error})"
            aside = store.move_aside(new_step, why)
            await self._roll_back(session, old_step, why)
            raise ServerError(
                f"{why}. The step was rolled back: the unserved checkpoint was moved aside to {aside}, the trainer is "
                f"at checkpoint {old_step} again and {session.served_name(old_step)} is still what a rollout gets. "
                "Call train again once the server answers; if it died, register the model again (the backend "
                "then restarts its server and trainer from the checkpoints on disk)"
            ) from error
        session.served.append(new_step)
        while len(session.served) > SERVED_ADAPTERS:
            retired = session.served.pop(0)
            try:
                await server.unload_adapter(session.served_name(retired))
            except ServerError as error:  # the new adapter serves; an old one only holds a slot
                logger.warning("could not unload %s: %s", session.served_name(retired), error)
        metrics["swap_s"] = time.perf_counter() - started
        session.step = new_step
        recording = self._record(session, groups, metrics, step=new_step, split=split, skipped=False)
        record_error = await self._record_committed(recording, new_step)
        return TrainResult(step=new_step, metrics=metrics, record_error=record_error)

    @staticmethod
    async def _record_committed(recording: Awaitable[None], step: int) -> str | None:
        """Await the record of a step that already happened; a failure is returned (and logged), never raised."""
        try:
            await recording
        except Exception as error:  # noqa: BLE001 - the step is committed and served whatever went wrong here
            message = f"step {step} is done, but recording its metrics failed: {type(error).__name__}: {error}"
            logger.error("%s", message)
            return message
        return None

    async def _roll_back(self, session: ModelSession, step: int, why: str) -> None:
        """Put the model's adapter and optimizer back to checkpoint `step` after a failed update or commit; if
        that fails too, the backend is broken (`BackendBrokenError`) until the next register rebuilds it."""
        try:
            await self._on_trainer_thread(self.trainer.load, session.adapter, session.store.path(step))
        except Exception as error:
            self._broken = (
                f"{why}, and restoring the trainer from checkpoint {step} failed too ({type(error).__name__}: "
                f"{error}), so the trainer no longer matches the disk. Register the model again: the backend then "
                f"rebuilds its server and trainer and resumes every model from its checkpoints on disk (this one at "
                f"{step})"
            )
            raise BackendBrokenError(self._broken) from error
        logger.warning("%s; the trainer was restored to checkpoint %d", why, step)

    async def _record(
        self,
        session: ModelSession,
        groups: list[TrajectoryGroup],
        metrics: dict[str, float],
        *,
        step: int,
        split: str,
        skipped: bool | None = None,
    ) -> None:
        """One step's record in the run folder (and in W&B when it is on)."""
        named = with_art_names(metrics, groups)
        if groups:  # the trajectories' own metrics (e.g. independent_reward beside a judge's reward), averaged
            for key, value in summarize([t for g in groups for t in g.trajectories]).items():
                named.setdefault(key, value)
        record = named if skipped is None else {"skipped": skipped, **named}
        await asyncio.to_thread(record_step, session.model.run_dir, step, split, groups, record)
        if session.wandb is not None:
            await asyncio.to_thread(session.wandb.log, step, split, record)

    async def log(self, model: TrainableModel, groups: list[TrajectoryGroup], split: str) -> dict[str, float]:
        """Record evaluation groups at the current step: metrics line, trajectories, transcript, plot."""
        check_safe_name(split, "split")  # it names files in the run folder: no path may come through it
        session = self.session(model)
        metrics = summarize([t for g in groups for t in g.trajectories])
        await self._record(session, groups, metrics, step=session.step, split=split)
        return metrics

    async def delete_checkpoints(self, model: TrainableModel, *, keep_last: int, best_by: str | None) -> list[int]:
        """Delete all but the last `keep_last` checkpoints and the best by `best_by` ("split/metric")."""
        session = self.session(model)
        keep: set[int] = set()
        if best_by is not None:
            best = await asyncio.to_thread(best_step, model.run_dir, best_by, session.store.steps())
            if best is None and best_by != DEFAULT_BEST_BY:
                raise ConfigurationError(
                    f"no checkpoint has a recorded {best_by!r}; give 'split/metric' as written to metrics.jsonl "
                    "(e.g. 'val/reward_mean' after model.log(..., split='val'), or 'train/reward_mean')"
                )
            keep = {best} if best is not None else set()
        async with session.busy:
            return await asyncio.to_thread(session.store.delete, keep_last=keep_last, keep=keep | {session.step})

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
            await asyncio.to_thread(engine.server.stop)
            await asyncio.to_thread(engine.trainer.close)

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
        self._trainer_thread.shutdown(wait=False)

    async def __aenter__(self) -> LocalBackend:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _vocab_size(model_path: str) -> int:
    """Rows of the model's token embedding: the ids its server can sample."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path)
    return int(config.get_text_config().vocab_size)
