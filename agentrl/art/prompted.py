"""ART's `art.Model` (a prompted model: a judge or a baseline) and what ART's two model classes share: naming,
litellm parameters, saved state, refusals as `ConfigurationError`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import PrivateAttr, ValidationError, model_validator

import agentrl
from agentrl.client.model import Backend
from agentrl.data.trajectory import Trajectory
from agentrl.data.trajectory_group import TrajectoryGroup
from agentrl.foundation.errors import ConfigurationError
from agentrl.foundation.files import check_safe_name
from agentrl.foundation.litellm_loader import load_litellm
from agentrl.foundation.sampled_record import served_name
from agentrl.records.step_metrics import summarize_groups
from agentrl.records.tracking import append_metrics

from .state import RunState

# ART's constructor keywords that only label a run (W&B entity, ids, metric reporters): kept, unused.
_LABELS = ("entity", "id", "run_id", "report_metrics")


def with_our_names(data: dict[str, Any]) -> dict[str, Any]:
    """ART's endpoint keywords under agentrl's names (`inference_base_url` -> `base_url`, ...)."""
    data = dict(data)
    for art_name, ours in {"inference_base_url": "base_url", "inference_api_key": "api_key"}.items():
        if art_name in data:
            data[ours] = data.pop(art_name)
    return data


def _has_provider(name: str) -> bool:
    """Whether `name` starts with a litellm route ("openai/gpt-4.1", "together_ai/..."), which litellm must get unchanged."""
    litellm = load_litellm()  # here, not at import: scripts that never call it should not wait for it

    prefix, slash, _ = name.partition("/")
    return bool(slash) and prefix in {str(p.value) if hasattr(p, "value") else str(p) for p in litellm.provider_list}


class ArtMethods(RunState):
    """What ART's two model classes share: naming, litellm parameters, state (`RunState`), metric logging."""

    name: str
    project: str
    base_path: str
    config: Any

    def __init__(self, **data: Any) -> None:
        """As pydantic's, but a refusal is a `ConfigurationError` naming the key and the fix, never a ValidationError."""
        try:
            super().__init__(**data)
        except ValidationError as error:
            raise configuration_error(error, type(self).__name__) from None

    def _served_name(self, step: int | None) -> str:
        raise NotImplementedError

    def get_inference_name(self, step: int | None = None) -> str:
        """The `model=` to send; for a trainable model, its adapter at `step` (default: the current one)."""
        return self._served_name(step)

    def safe_model_dump(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """`model_dump` with `config` set to None (ART's: your config object may not serialise)."""
        data: dict[str, Any] = super().model_dump(*args, **kwargs)  # type: ignore[misc]
        data["config"] = None
        return data

    def __class_getitem__(cls, config_type: Any) -> Any:
        """`art.Model[MyConfig]`: the config type is for your type checker; the class is the same."""
        return cls


def configuration_error(error: ValidationError, what: str) -> ConfigurationError:
    """A ValidationError as agentrl's error: the ConfigurationError a validator raised, else pydantic's findings."""
    for detail in error.errors():
        if isinstance(raised := (detail.get("ctx") or {}).get("error"), ConfigurationError):
            return raised
    findings = "; ".join(f"{'.'.join(map(str, d['loc'])) or what}: {d['msg']}" for d in error.errors())
    return ConfigurationError(f"{what}: {findings}")


class Model(ArtMethods, agentrl.Model):
    """ART's prompted model: a judge or a baseline you do not train, logged beside the trained ones."""

    entity: str | None = None
    id: str | None = None
    report_metrics: list[str] | None = None
    base_path: str = ".art"

    _backend: Backend | None = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _art_keywords(cls, data: Any) -> Any:
        return with_our_names(data) if isinstance(data, dict) else data

    @property
    def trainable(self) -> bool:
        return False

    @property
    def inference_base_url(self) -> str | None:
        return self.base_url

    @property
    def inference_api_key(self) -> str | None:
        return self._key()

    def _served_name(self, step: int | None) -> str:
        """Its name, or with `step` "{name}@{step}" (ART's name of a checkpoint, for a server that serves them)."""
        return self.inference_name if step is None else served_name(self.inference_name, step)

    def litellm_completion_params(self, step: int | None = None) -> dict[str, Any]:
        """`litellm.acompletion` keywords: model (a provider-prefixed name as given; "@{step}" with `step`),
        base_url, api_key, temperature 1 (ART's)."""
        name = self._served_name(step)
        model = name if _has_provider(name) or not self.base_url else f"{self.litellm_provider}/{name}"
        return {"model": model, "base_url": self.base_url, "api_key": self._key(), "temperature": 1}

    async def register(self, backend: Backend) -> None:
        """Remember the backend (ART registers prompted models for logging; nothing is served)."""
        self._backend = backend

    def backend(self) -> Backend:
        """The backend given to `register`."""
        if self._backend is None:
            raise ConfigurationError(f"model {self.name!r} is not registered: `await model.register(backend)` first")
        return self._backend

    async def get_step(self) -> int:
        """Always 0: a prompted model is never trained."""
        return 0

    async def log(
        self,
        trajectories: Iterable[Trajectory] | Iterable[TrajectoryGroup] | None = None,
        split: str = "val",
        *,
        metrics: Mapping[str, float] | None = None,
        step: int | None = None,
    ) -> None:
        """Record a prompted model's results (its reward and metrics) in {base_path}/{project}/models/{name}/metrics.jsonl."""
        check_safe_name(split, "split")
        items: list[Any] = list(trajectories or [])
        record: dict[str, Any] = {}
        if items:
            groups = [i if isinstance(i, TrajectoryGroup) else TrajectoryGroup([i]) for i in items]
            record.update(summarize_groups(groups))
        record.update(metrics or {})
        if record:
            append_metrics(self._art_dir, {"step": step or 0, "split": split, **record})
