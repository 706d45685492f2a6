"""ART's `art.dev.TrainConfig`: the advanced training settings passed as `model.train(..., _config=...)`.

Only the keys agentrl has a counterpart for (`agentrl.art.DEV_CONFIG_KEYS`); `with_dev_config` maps them
onto `agentrl.TrainConfig` and refuses any other key by name."""

from __future__ import annotations

from typing import Literal, TypedDict


class TrainConfig(TypedDict, total=False):
    allow_training_without_logprobs: bool
    scale_rewards: bool
    """agentrl's `scale_advantages_by_std`."""
    epsilon: float
    """PPO's lower clip (agentrl's `PPOLoss.clip_low`)."""
    epsilon_high: float
    """PPO's upper clip (agentrl's `PPOLoss.clip_high`)."""
    importance_sampling_level: Literal["token", "sequence"]
    """"sequence" trains with agentrl's GSPOLoss."""
    truncated_importance_sampling: float | None
