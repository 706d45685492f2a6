"""ART's `art.local.LocalBackend`: agentrl's LocalBackend with ART's constructor, ART 0.5's
`backend.train(model, groups, **training keys)` and `with LocalBackend() as backend:`."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import agentrl
from agentrl.data.trajectory_group import TrajectoryGroup
from agentrl.foundation.errors import ConfigurationError

from ..storage import fork_checkpoint, pull_from_s3, push_to_s3
from ..training import TRAIN_KEYS, agentrl_train_config, log_verbose, with_art_train_metrics


@dataclass
class LocalTrainResult(agentrl.TrainResult):
    """ART's result of `backend.train`: the new `step`, its `metrics` and where its `checkpoint_path` is."""

    checkpoint_path: str | None = None
    checkpoint_ready: Awaitable[None] | None = None
    """ART 0.5.20+'s signal for a checkpoint still being written: always None, agentrl's is complete on return."""


class LocalBackend(agentrl.LocalBackend):
    """`path`: where models registered with it keep their runs (by default, each model's `base_path`, ".art"). `in_process` is accepted
    (agentrl's trainer always runs in this process, the server in its own); `gpu_cost_per_hour_usd` is
    kept for your own accounting; `enable_expert_replay` is about MoE models and has no effect here."""

    def __init__(
        self,
        *,
        in_process: bool = False,
        path: str | None = None,
        gpu_cost_per_hour_usd: float | None = None,
        enable_expert_replay: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.art_path = path
        """Where registered models keep their runs when given (it overrides their `base_path`, as in ART)."""
        self.gpu_cost_per_hour_usd = gpu_cost_per_hour_usd

    @property
    def _path(self) -> str:
        """ART's name for where runs live (its scripts read `backend._path`): `path`, else ".art" as models default to."""
        return self.art_path if self.art_path is not None else ".art"

    async def train(  # type: ignore[override]
        self,
        model: agentrl.TrainableModel,
        trajectory_groups: Iterable[TrajectoryGroup],
        config: agentrl.TrainConfig | None = None,
        *,
        step_metrics: dict[str, float] | None = None,
        dropped: Sequence[TrajectoryGroup] = (),
        **keys: Any,
    ) -> LocalTrainResult:
        """ART 0.5's `backend.train(model, groups, learning_rate=..., loss_fn=..., ...)`: one step as ART
        trains it (CISPO by default); the model's step moves on. agentrl's own form `train(model, groups,
        config)` works too. Record the step with `model.log(groups, metrics=..., step=..., split="train")`
        as ART does (agentrl has already recorded the step's own metrics)."""
        groups = list(trajectory_groups)
        if config is not None:
            if keys:
                raise ConfigurationError("give either an agentrl.TrainConfig or ART's training keywords, not both")
            result = await super().train(model, groups, config, step_metrics=step_metrics, dropped=dropped)
            path = self.session(model).store.path(result.step)
            return LocalTrainResult(**vars(result), checkpoint_path=str(path) if path.exists() else None)
        unknown = sorted(set(keys) - set(TRAIN_KEYS))
        if unknown:
            raise TypeError(f"LocalBackend.train() got unexpected keyword arguments {unknown}")
        # Through the model, so that its served step moves on; it calls back into the branch above.
        trained = await agentrl.TrainableModel.train(model, groups, agentrl_train_config(keys), dropped=dropped)
        assert isinstance(trained, LocalTrainResult)
        if keys.get("save_checkpoint", True) is False:
            trained.checkpoint_path = (
                None  # as ART's: the result names no checkpoint (the step is still served from one)
            )
        trained.metrics = with_art_train_metrics(trained.metrics)
        log_verbose(bool(keys.get("verbose")), trained.step, trained.metrics)
        return trained

    def __enter__(self) -> LocalBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close_sync()

    def close_sync(self) -> None:
        """`close()` from synchronous code (ART's `with LocalBackend() as backend:`), also inside a notebook's
        running event loop (then on a thread of its own)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            asyncio.run(self.close())
            return
        failure: list[BaseException] = []

        def run() -> None:
            try:
                asyncio.run(self.close())
            except BaseException as error:  # noqa: BLE001 - re-raised below, on the caller's thread
                failure.append(error)

        thread = threading.Thread(target=run, name="agentrl-art-close")
        thread.start()
        thread.join()
        if failure:
            raise failure[0]

    async def _experimental_push_to_s3(
        self, model: agentrl.TrainableModel, *, s3_bucket: str | None = None, prefix: str | None = None, **kwargs: Any
    ) -> str:
        """Copy the model's run folder (checkpoints, metrics) to `s3://{s3_bucket}/{prefix}/...` or a local folder."""
        return await asyncio.to_thread(push_to_s3, model, s3_bucket=s3_bucket, prefix=prefix, **kwargs)

    async def _experimental_pull_from_s3(
        self,
        model: agentrl.TrainableModel,
        *,
        s3_bucket: str | None = None,
        prefix: str | None = None,
        only_step: int | str | None = None,
        exclude: Iterable[str] | None = None,
        step: int | None = None,
        **kwargs: Any,
    ) -> int | None:
        """Copy a run folder back from object storage (`only_step`: one checkpoint, "latest" or a step;
        `exclude`: "checkpoints", "logs", "trajectories"); returns the latest step pulled. Before `register`, or
        after it (as ART's 2048 script does): a registered model then resumes from the newest checkpoint pulled."""
        if kwargs.get("delete") and model.registered:
            raise ConfigurationError(
                "pull(delete=True) after `register`: it would move aside checkpoints the model is served from; pull "
                "with delete=True before registering, or without it"
            )
        self._place(model)
        only_step = step if only_step is None else only_step  # `step`: ART's older name
        latest = await asyncio.to_thread(
            pull_from_s3, model, s3_bucket=s3_bucket, prefix=prefix, only_step=only_step, exclude=exclude, **kwargs
        )
        if model.registered:
            await self._resume_again(model)
        return latest

    def _place(self, model: agentrl.TrainableModel) -> None:
        """Put an unregistered model's run folder under this backend's `path`, where `register` will (ART's backend
        keeps the files), so what a pull or fork copies is the run that then registers."""
        if self.art_path is not None and not model.registered:
            model.base_path = str(self.art_path)

    async def _resume_again(self, model: agentrl.TrainableModel) -> None:
        """After a pull into a registered model's folder: serve and train from its newest valid checkpoint."""
        session = self.session(model)
        async with session.busy:
            step = await self._trainer_thread.run(session.resume)
            if step != session.step:
                session.step = step
                await session.serve_current()
        await model.get_step()

    async def _experimental_fork_checkpoint(
        self,
        model: agentrl.TrainableModel,
        from_model: str,
        from_project: str | None = None,
        from_s3_bucket: str | None = None,
        not_after_step: int | None = None,
        verbose: bool = False,
        prefix: str | None = None,
    ) -> int:
        """Start `model` from another run's checkpoint (the latest, or the latest at or before `not_after_step`),
        local or in object storage; returns the step copied. Call before `register`."""
        if model.registered:
            raise ConfigurationError("fork before `register`: the model would keep serving its own checkpoint")
        self._place(model)
        return await asyncio.to_thread(
            fork_checkpoint,
            model,
            from_model=from_model,
            from_project=from_project or model.project,
            from_s3_bucket=from_s3_bucket,
            not_after_step=not_after_step,
            prefix=prefix,
            base_path=Path(self.art_path or model.base_path),
            verbose=verbose,
        )

    def exact_adapter_lease(self, model: agentrl.TrainableModel, step: int) -> Any:
        """ART 0.5.20+ pins a model's requests to one step's adapter inside this block; agentrl has no lease."""
        raise ConfigurationError(
            "backend.exact_adapter_lease has no counterpart: name the step in each request instead, "
            "model=model.get_inference_name(step) (agentrl serves the current step and the one before it)"
        )

    async def _experimental_pull_model_checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """ART pulls a checkpoint from W&B artifacts here; agentrl keeps checkpoints in the run folder."""
        raise ConfigurationError(
            "_experimental_pull_model_checkpoint (from W&B artifacts) has no counterpart: use "
            "_experimental_pull_from_s3(model, only_step=...) or _experimental_fork_checkpoint"
        )
