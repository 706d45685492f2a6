"""ART's `art.TrainableModel` on agentrl's (the prompted `art.Model` and what both share: `prompted`).

ART's keywords (`inference_base_url`, `inference_api_key`, `entity`, `id`, `run_id`, `lora_config`,
`_internal_config`, ...), ART's methods (`get_inference_name(step)`, `litellm_completion_params(step)`,
`backend()`, `log(..., metrics=, step=)`, the state helpers) and ART's default `base_path` ".art".
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import PrivateAttr, model_validator

import agentrl
from agentrl.client.model import Backend
from agentrl.data.trajectory import Trajectory
from agentrl.data.trajectory_group import TrajectoryGroup
from agentrl.foundation.errors import ConfigurationError
from agentrl.foundation.files import check_safe_name
from agentrl.foundation.sampled_record import served_name
from agentrl.records.run_folder import RunFolder
from agentrl.records.step_metrics import ART_METRIC_NAMES
from agentrl.records.tracking import append_metrics, read_metrics

from .context_length import context_length, sets_context
from .dev import internal_config_settings
from .lora import lora_as_art, lora_from_art
from .prompted import ArtMethods, with_our_names
from .state import deep_merged
from .training import (
    TrainConfig,
    agentrl_train_config,
    art_names_of,
    log_verbose,
    merged_keys,
    with_art_train_metrics,
)


class TrainableModel(ArtMethods, agentrl.TrainableModel):
    """ART's trainable model: `base_model` (a hub name or agentrl's packaged model), `lora_config`,
    `_internal_config` (art.dev.InternalModelConfig, its agentrl keys translated, at construction or
    assigned later), ART's `train`/`log`/`backend()`."""

    @property
    def _run_folder(self) -> RunFolder:
        """ART's layout: {base_path}/{project}/models/{run_name} ({name} without one)."""
        return RunFolder(self._art_dir)

    def metrics_builder(self, cost_context: str | None = None) -> Any:
        """ART's cost-metrics builder; agentrl records judge costs in the step's metrics (`judge_cost_usd`)."""
        raise ConfigurationError(
            "model.metrics_builder (ART's cost accounting) has no counterpart: judge costs are in each step's metrics "
            "(judge_cost_usd); record your own in trajectory.metrics or model.log(..., metrics=...)"
        )

    def update_wandb_config(self, config: dict[str, Any]) -> None:
        """Merge `config` into the model's W&B run config (ART's): now if the run is open, else when `register` opens
        it. Without W&B (no `wandb=True`, no WANDB_API_KEY) it is kept and nothing is logged, as ART's."""
        if not isinstance(config, dict):
            raise ConfigurationError(f"update_wandb_config takes a dict, got {type(config).__name__}")
        self._wandb_config = deep_merged(self._wandb_config, config)
        self._sync_wandb_config()

    def _sync_wandb_config(self) -> None:
        session = getattr(self._backend, "sessions", {}).get(str(self.run_dir.resolve())) if self.registered else None
        if session is not None and session.wandb is not None and self._wandb_config:
            session.wandb.update_config(self._wandb_config)

    @property
    def lora_config(self) -> dict[str, Any]:
        """The LoRA settings as ART's `LoRAConfig` dict (rank, alpha, dropout, target_modules)."""
        return lora_as_art(self.lora)

    entity: str | None = None
    id: str | None = None
    run_id: str | None = None
    report_metrics: list[str] | None = None
    base_path: str = ".art"
    _context_given: bool = PrivateAttr(default=False)
    run_name: str | None = None
    """ART 0.5.20+'s run identity: the run folder {base_path}/{project}/models/{run_name}, its object-storage keys and
    its W&B run, while `name` stays what clients send as `model=`. Without it (ART 0.5.18's scripts), `name`."""
    _wandb_config: dict[str, Any] = PrivateAttr(default_factory=dict)

    def __init__(self, **data: Any) -> None:
        super().__init__(**data)
        self._context_given = sets_context(data.get("server"), data.get("_internal_config"))

    @model_validator(mode="before")
    @classmethod
    def _art_keywords(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = with_our_names(data)
        if data.get("run_name") is None:
            data["run_name"] = data.get("name")  # ART 0.5.18's scripts: the run is named by `name`
        else:
            check_safe_name(data["run_name"], "run_name")
        lora_config = data.pop("lora_config", None)
        internal = data.pop("_internal_config", None)
        if lora_config is not None:
            data["lora"] = lora_from_art(lora_config)
        if internal:
            data.update(internal_config_settings(internal, lora=data.get("lora"), server=data.get("server")))
        return data

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "_internal_config":  # ART's 2048 example assigns it after construction
            if self.registered:
                raise ConfigurationError(
                    "_internal_config was assigned after `register`: the server already runs; assign it before"
                )
            for field, setting in internal_config_settings(value or {}, lora=self.lora, server=self.server).items():
                setattr(self, field, setting)
            self._context_given = self._context_given or sets_context(None, value)
            return
        super().__setattr__(name, value)

    @property
    def trainable(self) -> bool:
        return True

    @property
    def inference_base_url(self) -> str:
        return self._require_backend().endpoint(self).base_url

    @property
    def inference_api_key(self) -> str:
        return self._require_backend().endpoint(self).api_key

    def _served_name(self, step: int | None) -> str:
        return served_name(self.name, self.step if step is None else step)

    def litellm_completion_params(self, step: int | None = None) -> dict[str, Any]:
        """`litellm.acompletion` keywords for this model's adapter at `step` (default: current), temperature 1."""
        endpoint = self._require_backend().endpoint(self)
        return {
            "model": f"hosted_vllm/{self._served_name(step)}",
            "base_url": endpoint.base_url,
            "api_key": endpoint.api_key,
            "temperature": 1,
        }

    def backend(self) -> Backend:  # type: ignore[override]
        """The backend given to `register` (ART's method; agentrl's own models have it as a property)."""
        return self._require_backend()

    async def register(self, backend: Backend, _openai_client_config: Mapping[str, Any] | None = None) -> None:
        """As agentrl's; an ART `LocalBackend(path=...)` puts the run folder under its path (ART's backend
        keeps the files), whatever the model's `base_path`."""
        if _openai_client_config:
            raise ConfigurationError(
                "register(_openai_client_config=...) has no counterpart: agentrl's server is set with "
                "TrainableModel(server=agentrl.ServerConfig(...)) or _internal_config's engine_args"
            )
        path = getattr(backend, "art_path", None)
        if path is not None:
            self.base_path = str(path)
        if not self._context_given and isinstance(backend, agentrl.LocalBackend):
            context = await asyncio.to_thread(context_length, self.base_model)
            self.server = self.server.model_copy(update={"max_model_len": context})
            self._context_given = True
        await agentrl.TrainableModel.register(self, backend)
        self._sync_wandb_config()  # what update_wandb_config was given before the run opened

    async def train(
        self,
        trajectory_groups: Iterable[TrajectoryGroup],
        config: TrainConfig | agentrl.TrainConfig | None = None,
        _config: Mapping[str, Any] | None = None,
        verbose: bool = False,
        *,
        step_metrics: dict[str, float] | None = None,
        dropped: Sequence[TrajectoryGroup] = (),
    ) -> agentrl.TrainResult:
        """ART's older training call (to 0.5.17): `model.train(groups, config=art.TrainConfig(...),
        _config=art.dev.TrainConfig(...))`, one step, as ART trains it (CISPO by default). An
        `agentrl.TrainConfig` trains as agentrl's own `model.train` (what `train_pipelined` calls)."""
        if isinstance(config, agentrl.TrainConfig):
            if _config:
                raise ConfigurationError("_config is ART's; with an agentrl.TrainConfig set its fields instead")
            return await agentrl.TrainableModel.train(
                self, list(trajectory_groups), config, step_metrics=step_metrics, dropped=dropped
            )
        keys = merged_keys(config, _config)
        train_config = agentrl_train_config(keys)
        result = await agentrl.TrainableModel.train(
            self, list(trajectory_groups), train_config, step_metrics=step_metrics, dropped=dropped
        )
        result.metrics = with_art_train_metrics(result.metrics)
        log_verbose(verbose or bool(keys.get("verbose")), result.step, result.metrics)
        return result

    async def train_sft(
        self,
        trajectories: Iterable[Any],
        config: Any = None,
        _config: Mapping[str, Any] | None = None,
        verbose: bool = False,
        log_metrics: bool = True,
    ) -> agentrl.TrainResult:
        """Supervised training on demonstrations (ART's `TrainSFTConfig` or agentrl's `SFTConfig`)."""
        from .types import sft_config

        check_log_metrics(log_metrics)
        if _config:
            raise ConfigurationError(f"train_sft's _config keys {sorted(_config)} have no counterpart in agentrl")
        result = await agentrl.TrainableModel.train_sft(self, list(trajectories), sft_config(config))
        log_verbose(verbose, result.step, result.metrics)
        return result

    async def log(  # type: ignore[override]
        self,
        trajectories: Iterable[Trajectory] | Iterable[TrajectoryGroup] | None = None,
        split: str = "val",
        *,
        metrics: Mapping[str, float] | None = None,
        step: int | None = None,
    ) -> None:
        """ART's `model.log`: trajectories recorded at the current step under `split`, and `metrics`.
        A training step's own metrics are already recorded by `backend.train`; `model.log(groups,
        metrics=result.metrics, step=result.step, split="train")` adds only the keys it lacks."""
        check_safe_name(split, "split")
        current = await self.get_step()
        if step is not None and step != current:
            raise ConfigurationError(
                f"model.log(step={step}): agentrl records results at the step being served ({current}); "
                "log right after the step that produced them"
            )
        items: list[Any] = list(trajectories or [])
        already: set[str] = set()
        recorded = [r for r in read_metrics(self.run_dir) if r.get("step") == current and r.get("split") == split]
        if items and not (split == "train" and recorded):
            await agentrl.TrainableModel.log(self, items, split)
            recorded = [r for r in read_metrics(self.run_dir) if r.get("step") == current and r.get("split") == split]
        for record in recorded:
            already.update(record)
        already.update(art_names_of(already))  # ART's names of what the step recorded under agentrl's
        extra = {k: v for k, v in (metrics or {}).items() if k not in already}
        if extra:
            append_metrics(self.run_dir, {"step": current, "split": split, **extra})

    async def delete_checkpoints(  # type: ignore[override]
        self, best_checkpoint_metric: str = "val/reward", *, keep_last: int = 1
    ) -> list[int]:
        """ART's form: keep the latest and the best by `best_checkpoint_metric` (ART's metric names)."""
        return await agentrl.TrainableModel.delete_checkpoints(
            self, keep_last=keep_last, best_by=agentrl_metric(best_checkpoint_metric)
        )


def check_log_metrics(log_metrics: bool) -> None:
    """ART 0.5.20+'s `train_sft(log_metrics=False)` (no metrics logged): agentrl records every training call."""
    if not log_metrics:
        raise ConfigurationError(
            "train_sft(log_metrics=False) has no counterpart: agentrl records every training call's metrics in the "
            "run's records (a run resumes and replays from them); leave log_metrics at True"
        )


def agentrl_metric(art_metric: str) -> str:
    """ "val/reward" -> "val/reward_mean": an ART metric name as agentrl records it."""
    split, _, name = art_metric.rpartition("/")
    name = ART_METRIC_NAMES.get(name, name)
    return f"{split}/{name}" if split else name
