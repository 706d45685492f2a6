"""One registered model on a backend: its run folder's lock and checkpoints, its trainer adapter and step,
and the step transaction (resume, commit, roll back, record) over the trainer and server it is handed."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from agentrl.backend.training.step_input import StepInput, write_step_input
from agentrl.client.backend_protocol import TrainResult
from agentrl.foundation.errors import BackendBrokenError, CheckpointError, ConfigurationError, ServerError
from agentrl.foundation.sampled_record import served_name
from agentrl.foundation.timeline import append_timeline, recorder, span
from agentrl.records.checkpoints import CheckpointStore
from agentrl.records.step_metrics import step_line
from agentrl.records.step_record import backfill_records, write_step_record
from agentrl.records.tracking import DEFAULT_BEST_BY, best_step, record_step
from agentrl.records.wandb_metrics import WandbMetrics, wandb_requested

if TYPE_CHECKING:
    from pathlib import Path

    from agentrl.backend.run_lock import RunLock
    from agentrl.backend.training.adapter_trainer import AdapterTrainer, StepOutcome
    from agentrl.client.model import TrainableModel
    from agentrl.data.trajectory_group import TrajectoryGroup
    from agentrl.foundation.config import TrainConfig

logger = logging.getLogger(__name__)
T = TypeVar("T")

SERVED_ADAPTERS = 2
"""Adapters kept loaded per model: the new one and the one before, so a request that named the old
adapter just before a swap (a pipelined rollout's next turn) is still answered, by the adapter it named."""


class TrainerThread:
    """The one thread every trainer call runs on. Spread over a pool's threads, torch's allocations land
    in several glibc malloc arenas that never share freed memory: measured here, peak RSS grew to
    13.6 GB over three steps instead of holding at 6.3 GB."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentrl-trainer")
        self._narrowed = 0  # blocks inside `one_thread_while(True)`: pipelined runs of several models overlap
        self._threads_before = 0

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`fn(*args, **kwargs)` on the thread, as a span of the run's timeline (track "trainer")."""
        call = functools.partial(_spanned, getattr(fn, "__name__", "trainer call"), fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    @contextlib.asynccontextmanager
    async def one_thread_while(self, narrow: bool) -> AsyncIterator[bool]:
        """With `narrow`, torch computes the trainer's calls on one thread until the last such block ends (OpenMP
        counts threads per calling thread, so the count is set on this one, and set back after); yields `narrow`."""
        if not narrow:
            yield False
            return
        loop = asyncio.get_running_loop()
        self._narrowed += 1
        if self._narrowed == 1:
            self._threads_before = await loop.run_in_executor(self._executor, _use_threads, 1)
        try:
            yield True
        finally:
            self._narrowed -= 1
            if not self._narrowed:
                await loop.run_in_executor(self._executor, _use_threads, self._threads_before)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False)


def _use_threads(count: int) -> int:
    """Set torch's intra-op threads for the calling thread; the count before."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(count)
    return before


def _spanned(name: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    with span(name, "trainer"):
        return fn(*args, **kwargs)


class AdapterServer(Protocol):
    """What a session asks of the inference server: serve a checkpoint under a name, and stop serving it."""

    async def load_adapter(self, name: str, path: Path) -> None: ...
    async def unload_adapter(self, name: str) -> None: ...


@dataclass
class ModelSession:
    """One registered model: its run folder's lock, checkpoints, trainer adapter and step, and how its
    step moves (every trainer call on `thread`; the server holds its last `SERVED_ADAPTERS` checkpoints)."""

    model: TrainableModel
    adapter: str
    """The trainer's name for this model's LoRA adapter."""
    store: CheckpointStore
    lock: RunLock
    trainer: AdapterTrainer
    server: AdapterServer
    thread: TrainerThread
    step: int = 0
    wandb: WandbMetrics | None = None
    served: list[int] = field(default_factory=list)
    """Steps whose adapters the server holds, oldest first (the last `SERVED_ADAPTERS`)."""
    busy: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Held by a call that changes the step (train, train_sft), so one runs at a time per model."""

    def served_name(self, step: int | None = None) -> str:
        return served_name(self.model.name, self.step if step is None else step)

    def resume(self) -> int:
        """Load the newest checkpoint that validates, moving the ones that do not aside (step 0, untrained,
        if none is left); returns its step. Blocking: run it on the trainer thread."""
        store, trainer = self.store, self.trainer
        steps = store.steps()
        for step in reversed(steps):
            try:
                store.info(step)
                trainer.load(self.adapter, store.path(step))
            except CheckpointError as error:
                aside = store.move_aside(step, str(error))
                logger.warning("checkpoint %d is corrupt and was moved aside to %s: %s", step, aside, error)
                continue
            try:
                backfill_records(self.model.run_dir)
            except Exception as error:  # noqa: BLE001 - the checkpoints are whole; only their records could not be rewritten
                logger.warning("could not write lost step records again from the checkpoints: %s: %s",
                               type(error).__name__, error)  # fmt: skip
            return step
        if steps:
            logger.warning("no valid checkpoint left in %s: starting again from an untrained adapter", store.root)
        store.save(0, functools.partial(trainer.save, self.adapter), {"metrics": {}})
        return 0

    def with_kl_reference(self, config: TrainConfig) -> TrainConfig:
        """`config` with a `kl_reference` step resolved to that checkpoint's folder (a negative step counts back
        from the step about to be trained, never before 0); a missing checkpoint raises, naming the steps kept."""
        step = config.kl_reference
        if not isinstance(step, int):
            return config
        if step < 0:
            step = max(0, self.step + 1 + step)
        kept = self.store.steps()
        if step not in kept:
            raise ConfigurationError(
                f"kl_reference={config.kl_reference} asks for checkpoint {step}, which {self.model.name!r} does not "
                f"have (it keeps {kept}): give a kept step, or None for the base model"
            )
        return config.model_copy(update={"kl_reference": str(self.store.path(step))})

    async def serve_current(self) -> None:
        """Load the current step's checkpoint into the server (at register)."""
        await self.server.load_adapter(self.served_name(), self.store.path(self.step))
        self.served.append(self.step)

    async def commit(
        self,
        outcome: StepOutcome,
        *,
        split: str,
        groups: list[TrajectoryGroup],
        step_input: StepInput | None = None,
    ) -> TrainResult:
        """Checkpoint the adapter as the next step (with `step_input`, what it trained on, for a replay)
        and serve it; or record a skipped step.

        If the save or the switch fails, the adapter goes back to the last served checkpoint (an
        unserved new checkpoint is moved aside, not deleted, and unloaded from every replica that took
        it) and the error says so: the step did not happen, and calling train again applies exactly one
        step. Once the new checkpoint is served the step is committed: a failure to record its metrics
        is reported in `TrainResult.record_error`, never raised (a retry would apply a second step).
        """
        metrics = dict(outcome.metrics)
        if not outcome.updated:
            line = step_line(metrics, groups, None)  # what the caller is told; metrics.jsonl adds `skipped`
            recording = self.record(groups, {"skipped": True, **line}, step=self.step, split=split)
            record_error = await _record_committed(recording, self.step)
            return TrainResult(step=self.step, metrics=line, skipped=True, record_error=record_error)
        new_step, old_step = self.step + 1, self.step
        metrics["save_s"] = await self._save(new_step, old_step, metrics, step_input, (split, groups))
        metrics["swap_s"] = await self._swap(new_step, old_step)
        self.step = new_step
        line = step_line(metrics, groups, None)
        recording = self.record(groups, {"skipped": False, **line}, step=new_step, split=split)
        record_error = await _record_committed(recording, new_step)
        return TrainResult(step=new_step, metrics=line, record_error=record_error)

    async def _save(
        self,
        new_step: int,
        old_step: int,
        metrics: dict[str, float],
        step_input: StepInput | None,
        record: tuple[str, list[TrajectoryGroup]],
    ) -> float:
        """Write checkpoint `new_step` with the step's metrics, input and record (its split and trajectories, so a
        crash between the commit and the run's records loses nothing: `backfill_records`), rolled back on failure;
        returns the seconds it took. The input's compressed size is the metric `step_input_bytes`."""
        started, store = time.perf_counter(), self.store
        split, groups = record

        def write(folder: Path) -> None:
            self.trainer.save(self.adapter, folder)
            if step_input is not None:
                metrics["step_input_bytes"] = float(write_step_input(folder, step_input))
            write_step_record(folder, groups)

        try:
            info = {"metrics": dict(metrics), "split": split}
            await self.thread.run(store.save, new_step, write, info)
        except Exception as error:
            await self.roll_back(old_step, f"saving checkpoint {new_step} failed ({type(error).__name__}: {error})")
            raise CheckpointError(
                f"saving checkpoint {new_step} to {store.path(new_step)} failed: {type(error).__name__}: {error}. The "
                f"step was rolled back (the trainer is at checkpoint {old_step} again, still served): free disk space "
                "or fix the folder, then call train again"
            ) from error
        return time.perf_counter() - started

    async def _swap(self, new_step: int, old_step: int) -> float:
        """Serve checkpoint `new_step` and retire the oldest served one (rolled back if the server cannot
        load it); returns the seconds it took."""
        started = time.perf_counter()
        try:
            with span("swap", "server", step=new_step):
                await self.server.load_adapter(self.served_name(new_step), self.store.path(new_step))
        except Exception as error:
            why = f"the server could not load checkpoint {new_step} ({type(error).__name__}: {error})"
            aside = self.store.move_aside(new_step, why)
            await self.roll_back(old_step, why)
            raise ServerError(
                f"{why}. The step was rolled back: the unserved checkpoint was moved aside to {aside}, the trainer is "
                f"at checkpoint {old_step} again and {self.served_name(old_step)} is still what a rollout gets. "
                "Call train again once the server answers; if it died, register the model again (the backend "
                "then restarts its server and trainer from the checkpoints on disk)"
            ) from error
        self.served.append(new_step)
        while len(self.served) > SERVED_ADAPTERS:
            retired = self.served.pop(0)
            try:
                await self.server.unload_adapter(self.served_name(retired))
            except ServerError as error:  # the new adapter serves; an old one only holds a slot
                logger.warning("could not unload %s: %s", self.served_name(retired), error)
        return time.perf_counter() - started

    async def roll_back(self, step: int, why: str) -> None:
        """Put the adapter and optimizer back to checkpoint `step` after a failed update or commit; if that
        fails too, the trainer no longer matches the disk: `BackendBrokenError`, which the backend keeps."""
        try:
            await self.thread.run(self.trainer.load, self.adapter, self.store.path(step))
        except Exception as error:
            raise BackendBrokenError(
                f"{why}, and restoring the trainer from checkpoint {step} failed too ({type(error).__name__}: "
                f"{error}), so the trainer no longer matches the disk. Register the model again: the backend then "
                f"rebuilds its server and trainer and resumes every model from its checkpoints on disk (this one at "
                f"{step})"
            ) from error
        logger.warning("%s; the trainer was restored to checkpoint %d", why, step)

    async def delete_checkpoints(self, *, keep_last: int, best_by: str | None) -> list[int]:
        """Delete all but the last `keep_last` checkpoints, the best by `best_by` ("split/metric") and the served one."""
        keep: set[int] = set()
        if best_by is not None:
            best = await asyncio.to_thread(best_step, self.model.run_dir, best_by, self.store.steps())
            if best is None and best_by != DEFAULT_BEST_BY:
                raise ConfigurationError(
                    f"no checkpoint has a recorded {best_by!r}; give 'split/metric' as written to metrics.jsonl "
                    "(e.g. 'val/reward_mean' after model.log(..., split='val'), or 'train/reward_mean')"
                )
            keep = {best} if best is not None else set()
        async with self.busy:
            return await asyncio.to_thread(self.store.delete, keep_last=keep_last, keep=keep | {self.step})

    async def record(self, groups: list[TrajectoryGroup], record: dict[str, float], *, step: int, split: str) -> None:
        """One step's record in the run folder (and in W&B when it is on): `record` is the line `step_line` built."""
        await asyncio.to_thread(record_step, self.model.run_dir, step, split, groups, record)
        await asyncio.to_thread(append_timeline, self.model.run_dir, recorder.take())
        if self.wandb is not None:
            await asyncio.to_thread(self.wandb.log, step, split, record)


async def open_session(
    model: TrainableModel,
    adapter: str,
    lock: RunLock,
    trainer: AdapterTrainer,
    server: AdapterServer,
    thread: TrainerThread,
) -> ModelSession:
    """`model`'s session as adapter `adapter` of `trainer`: resumed from its latest valid checkpoint (its run
    folder's leftover staging swept first), W&B opened where asked, and served by `server`."""
    await thread.run(trainer.add_adapter, adapter, model.lora)
    store = CheckpointStore(model.run_dir)
    store.sweep_staging()
    session = ModelSession(model, adapter, store, lock, trainer, server, thread)
    session.step = await thread.run(session.resume)
    if wandb_requested(model.wandb):
        config = model.model_dump(mode="json", include={"base_model", "lora", "server"})
        session.wandb = await asyncio.to_thread(
            WandbMetrics, model.run_dir, project=model.project, name=model.run_dir.name, config=config
        )
    await session.serve_current()
    return session


async def _record_committed(recording: Awaitable[None], step: int) -> str | None:
    """Await the record of a step that already happened; a failure is returned (and logged), never raised."""
    try:
        await recording
    except Exception as error:  # noqa: BLE001 - the step is committed and served whatever went wrong here
        message = f"step {step} is done, but recording its metrics failed: {type(error).__name__}: {error}"
        logger.error("%s", message)
        return message
    return None
