"""ART's public API on top of agentrl: code written for OpenPipe's ART runs after changing its imports.

    import agentrl.art as art                          # was: import art
    from agentrl.art.local import LocalBackend         # was: from art.local import LocalBackend
    from agentrl.art.rewards import ruler_score_group  # was: from art.rewards import ruler_score_group
    from agentrl.art.utils import iterate_dataset      # was: from art.utils import iterate_dataset

Names, keywords and defaults follow ART's documentation; each maps onto agentrl's own API (README,
"Coming from ART"). Where ART offers something agentrl does not, the call raises a ConfigurationError
that says so and what to use instead. Written from ART's documented signatures, not from its code.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from openai.types.chat.chat_completion import Choice
from pydantic import Field, model_validator

import agentrl
from agentrl.capture import capture_trajectory, current_trajectory
from agentrl.config import GSPOLoss, PPOLoss
from agentrl.errors import ConfigurationError
from agentrl.gather import gather_trajectories
from agentrl.trajectory import History, Trajectory, TrajectoryGroup

from . import dev  # `art.dev.TrainConfig`, as ART users reach it

__all__ = [
    "dev",
    "Model",
    "TrainableModel",
    "TrainConfig",
    "Trajectory",
    "TrajectoryGroup",
    "History",
    "Messages",
    "MessagesAndChoices",
    "Tools",
    "gather_trajectory_groups",
    "gather_trajectories",
    "retry",
    "capture_auto_trajectory",
    "auto_trajectory",
]

Messages = list[dict[str, Any]]
MessagesAndChoices = list[dict[str, Any] | Choice]
Tools = list[dict[str, Any]]
T = TypeVar("T")


def _renamed(data: Any, renames: dict[str, str]) -> Any:
    if isinstance(data, dict):
        data = dict(data)
        for art_name, ours in renames.items():
            if art_name in data:
                data[ours] = data.pop(art_name)
    return data


class TrainConfig(agentrl.TrainConfig):
    """ART's TrainConfig: `learning_rate` (ART's default 5e-6) and `beta`, the KL penalty (agentrl's `kl_coef`)."""

    learning_rate: float = Field(default=5e-6, gt=0)
    beta: float = Field(default=0.0, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _beta_is_the_kl_coefficient(cls, data: Any) -> Any:
        if isinstance(data, dict) and "beta" in data and "kl_coef" not in data:
            data = {**data, "kl_coef": data["beta"]}
        return data


# ART's `_config` (art.dev.TrainConfig) keys and what each becomes in agentrl's TrainConfig.
DEV_CONFIG_KEYS = (
    "allow_training_without_logprobs",
    "scale_rewards",
    "epsilon",
    "epsilon_high",
    "importance_sampling_level",
    "truncated_importance_sampling",
)


def with_dev_config(config: agentrl.TrainConfig, dev: dict[str, Any] | None) -> agentrl.TrainConfig:
    """`config` with ART's `_config` (art.dev.TrainConfig, a dict) applied; unknown keys raise."""
    dev = dict(dev or {})
    unknown = sorted(set(dev) - set(DEV_CONFIG_KEYS))
    if unknown:
        raise ConfigurationError(
            f"_config keys {unknown} have no counterpart in agentrl (it takes {list(DEV_CONFIG_KEYS)}); "
            "set the matching agentrl.TrainConfig field instead (see its documentation)"
        )
    update: dict[str, Any] = {}
    if "allow_training_without_logprobs" in dev:
        update["allow_training_without_logprobs"] = bool(dev["allow_training_without_logprobs"])
    if "scale_rewards" in dev:
        update["scale_advantages_by_std"] = bool(dev["scale_rewards"])
    if "truncated_importance_sampling" in dev:
        update["truncated_importance_sampling"] = float(dev["truncated_importance_sampling"] or 0.0)
    if dev.get("importance_sampling_level") == "sequence":
        update["loss"] = GSPOLoss()
    elif "epsilon" in dev or "epsilon_high" in dev:
        low = float(dev.get("epsilon", PPOLoss().clip_low))
        update["loss"] = PPOLoss(clip_low=low, clip_high=float(dev.get("epsilon_high") or low))
    return type(config).model_validate({**config.model_dump(), **update}) if update else config


class _ArtMethods:
    """ART's accessors, shared by both model classes."""

    inference_name: str

    def get_inference_name(self) -> str:
        """The `model=` to send (ART's name for `inference_name`)."""
        return self.inference_name

    def litellm_completion_params(self) -> dict[str, Any]:
        """Keyword arguments for `litellm.acompletion` (ART's name for `litellm_params()`)."""
        return self.litellm_params()  # type: ignore[attr-defined,no-any-return]

    def __class_getitem__(cls, config_type: Any) -> Any:
        """`Model[MyConfig]`: the config type is for your type checker; the class is the same."""
        return cls


class Model(_ArtMethods, agentrl.Model):
    """ART's Model: a model you do not train (a judge, a prompted baseline), with ART's keywords
    `inference_model_name`, `inference_base_url`, `inference_api_key` and a `config` of your own."""

    @model_validator(mode="before")
    @classmethod
    def _art_keywords(cls, data: Any) -> Any:
        return _renamed(data, {"inference_base_url": "base_url", "inference_api_key": "api_key"})

    @property
    def trainable(self) -> bool:
        return False

    @property
    def inference_base_url(self) -> str | None:
        return self.base_url

    @property
    def inference_api_key(self) -> str | None:
        return self._key()


class TrainableModel(_ArtMethods, agentrl.TrainableModel):
    """ART's TrainableModel: `base_model` as a hub name (or agentrl's packaged model), ART's `train` keywords."""

    @model_validator(mode="before")
    @classmethod
    def _art_keywords(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("_internal_config") is not None:
            raise ConfigurationError(
                "_internal_config (ART's engine and peft settings) has no counterpart: pass "
                "lora=agentrl.LoRAConfig(...) and server=agentrl.ServerConfig(...) instead"
            )
        return {k: v for k, v in data.items() if k != "_internal_config"} if isinstance(data, dict) else data

    @property
    def trainable(self) -> bool:
        return True

    @property
    def inference_base_url(self) -> str:
        return self.backend.endpoint(self).base_url

    @property
    def inference_api_key(self) -> str:
        return self.backend.endpoint(self).api_key

    async def register(self, backend: agentrl.Backend) -> None:
        """As agentrl's, and an ART `LocalBackend(path=...)` puts the run folder under its path."""
        path = getattr(backend, "art_path", None)
        if path is not None and "base_path" not in self.model_fields_set:
            self.base_path = str(path)
        await super().register(backend)

    async def train(  # type: ignore[override]
        self,
        trajectory_groups: Iterable[TrajectoryGroup],
        config: agentrl.TrainConfig | None = None,
        _config: dict[str, Any] | None = None,
        verbose: bool = False,
        *,
        step_metrics: dict[str, float] | None = None,
    ) -> agentrl.TrainResult:
        """ART's `model.train(groups, config=art.TrainConfig(...), _config={...})`: one GRPO step."""
        merged = with_dev_config(config or TrainConfig(), _config)
        return await super().train(list(trajectory_groups), merged, step_metrics=step_metrics)

    async def delete_checkpoints(  # type: ignore[override]
        self, best_checkpoint_metric: str = "val/reward", *, keep_last: int = 1
    ) -> list[int]:
        """ART's form: keep the latest and the best by `best_checkpoint_metric` (ART's metric names)."""
        return await super().delete_checkpoints(keep_last=keep_last, best_by=agentrl_metric(best_checkpoint_metric))


# ART's metric names and agentrl's (metrics.jsonl holds both).
ART_METRICS = {"reward": "reward_mean", "reward_std_dev": "reward_std"}


def agentrl_metric(art_metric: str) -> str:
    """ "val/reward" -> "val/reward_mean": an ART metric name as agentrl records it."""
    split, _, name = art_metric.rpartition("/")
    name = ART_METRICS.get(name, name)
    return f"{split}/{name}" if split else name


async def gather_trajectory_groups(
    groups: Iterable[TrajectoryGroup],
    *,
    pbar_desc: str | None = "gather",
    pbar_total_completion_tokens: bool = True,
    max_exceptions: int | float = 0,
    max_metrics: int | None = None,
    after_each: Callable[[TrajectoryGroup], Awaitable[Any]] | None = None,
) -> list[TrajectoryGroup]:
    """ART's gather: `max_exceptions` is a count (int) or a fraction of the rollouts (a float below 1);
    `after_each` may return a group, None (drop it) or a list of groups (all kept)."""
    fraction = isinstance(max_exceptions, float) and 0 < max_exceptions < 1
    more: list[TrajectoryGroup] = []

    async def each(group: TrajectoryGroup) -> TrajectoryGroup | None:
        assert after_each is not None
        result: Any = await after_each(group)
        if isinstance(result, list):
            more.extend(result[1:])
            return result[0] if result else None
        return result  # type: ignore[no-any-return]

    gathered = await agentrl.gather_trajectory_groups(
        groups,
        max_exceptions=None if fraction else int(max_exceptions),
        max_exception_rate=float(max_exceptions) if fraction else None,
        after_each=each if after_each is not None else None,
        desc=pbar_desc or "gather",
        show_progress=pbar_desc is not None,
    )
    return [*gathered, *more]


def retry(
    max_attempts: int = 3,
    min_delay: float = 1.0,
    max_delay: float = 10.0,
    exceptions: tuple[type[BaseException], ...] = (Exception,),
) -> Callable[[Callable[..., Awaitable[T]]], Callable[..., Awaitable[T]]]:
    """ART's retry decorator (agentrl.retry with ART's keywords)."""
    return agentrl.retry(max_attempts, exceptions=exceptions, min_wait_s=min_delay, max_wait_s=max_delay)


async def capture_auto_trajectory(coroutine: Awaitable[Any]) -> Trajectory:
    """Run `coroutine` and return the trajectory of every completion it made through the gateway
    (agentrl.capture_trajectory); set its reward inside with `auto_trajectory().reward = ...`."""
    with capture_trajectory() as trajectory:
        await coroutine
    return trajectory


def auto_trajectory(required: bool = False) -> Trajectory | None:
    """The trajectory being captured now (inside `capture_auto_trajectory`), or None."""
    trajectory = current_trajectory()
    if trajectory is None and required:
        raise ConfigurationError("auto_trajectory(required=True) outside capture_auto_trajectory(...)")
    return trajectory
