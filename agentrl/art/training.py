"""ART's training settings and what each becomes in `agentrl.TrainConfig`.

ART 0.5 passes them as keywords of `backend.train(model, groups, ...)`; older scripts as
`model.train(groups, config=art.TrainConfig(...), _config=art.dev.TrainConfig(...))`. Both reach
`agentrl_train_config`, which maps every key that changes training the way ART changes it and
raises, naming the key, for a key agentrl has no counterpart of. A key at ART's default is
accepted either way: it asks for nothing. ART's default loss is CISPO with epsilon 1.0 / 4.0.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

import agentrl
from agentrl.config import CISPOLoss, PPOLoss
from agentrl.errors import ConfigurationError

logger = logging.getLogger(__name__)


class TrainConfig(BaseModel):
    """ART's `art.TrainConfig`: the learning rate and the KL penalty (`beta` in scripts before 0.5.11)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    learning_rate: float = Field(default=5e-6, gt=0)
    kl_penalty_coef: float = Field(default=0.0, ge=0)
    """ART's KL penalty: it shapes the advantages by the KL to the base model (agentrl's `kl_advantage_coef`)."""
    kl_penalty_source: Literal["current_learner", "sample"] = "current_learner"
    grad_accumulation_sequences: int | None = None
    beta: float = Field(default=0.0, ge=0)
    """ART's KL penalty before 0.5.11, a loss term to the reference (agentrl's `kl_coef`)."""


# Keys that change training, and ART's default for each (a key at its default asks for nothing).
MAPPED_DEFAULTS: dict[str, Any] = {
    "learning_rate": 5e-6,
    "loss_fn": "cispo",
    "ppo": False,
    "epsilon": None,
    "epsilon_high": None,
    "importance_sampling_level": "token",
    "kl_penalty_coef": 0.0,
    "beta": 0.0,
    "kl_penalty_source": "current_learner",
    "scale_rewards": True,
    "kimi_k2_tau": None,
    "advantage_balance": 0.0,
    "max_negative_advantage_importance_sampling_weight": None,
    "mask_prob_ratio": False,
    "normalize_advantages": True,
    "allow_training_without_logprobs": False,
    "truncated_importance_sampling": None,
    "packed_sequence_length": None,
    "save_checkpoint": True,
    "verbose": False,
}
# Keys that only change how ART computes (memory, speed), not what it learns: accepted, nothing to do.
COMPUTE_ONLY = ("logprob_calculation_chunk_size", "precalculate_logprobs", "plot_tensors")
# Keys ART 0.5.18's LocalBackend takes and applies nowhere (its Model.train did, and is gone): accepted as ART accepts
# them, with a warning that says so.
INERT = {"scale_learning_rate_by_reward_std_dev": False}
# Keys agentrl has no counterpart for: only their ART default is accepted; what to do instead otherwise.
UNSUPPORTED: dict[str, tuple[Any, str]] = {
    "loss_fn_config": (
        None,
        "ART's own LocalBackend refuses it too; choose the loss with loss_fn and its clips with epsilon/epsilon_high",
    ),
    "adam_params": (
        None,
        "ART's own LocalBackend refuses it too; agentrl trains with AdamW at its defaults "
        "(agentrl.TrainConfig.weight_decay)",
    ),
    "kl_penalty_reference_step": (
        None,
        "agentrl's KL reference is the base model (the adapter off), ART's default "
        "reference; a checkpoint as the reference is not supported",
    ),
    "kl_ref_adapter_path": (
        None,
        "agentrl's KL reference is the base model (the adapter off), ART's default "
        "reference; an adapter as the reference is not supported",
    ),
    "kl_penalty_step_lag": (None, "agentrl's KL penalty is always to the base model"),
    "num_trajectories_learning_rate_multiplier_power": (
        0.0,
        "ART scales each packed batch's optimizer step by its "
        "trajectory count; agentrl takes one optimizer step per train "
        "call: scale learning_rate yourself",
    ),
    "megatron_topology": (None, "agentrl trains with torch.distributed ranks (LocalBackend(ranks=...))"),
    "grad_accumulation_sequences": (None, "agentrl accumulates by tokens (agentrl.TrainConfig.micro_batch_tokens)"),
}
TRAIN_KEYS = (*MAPPED_DEFAULTS, *COMPUTE_ONLY, *INERT, *UNSUPPORTED)


def _check_unsupported(keys: Mapping[str, Any]) -> None:
    unknown = sorted(set(keys) - set(TRAIN_KEYS))
    if unknown:
        raise ConfigurationError(f"ART training keys {unknown} are not ART 0.5.18's; the keys are {sorted(TRAIN_KEYS)}")
    for key, (default, instead) in UNSUPPORTED.items():
        if key in keys and keys[key] != default:
            raise ConfigurationError(
                f"{key}={keys[key]!r} has no counterpart in agentrl (only ART's default {default!r} is accepted): {instead}"
            )


def _loss(keys: Mapping[str, Any]) -> CISPOLoss | PPOLoss:
    name = "ppo" if keys.get("ppo") else keys.get("loss_fn") or "cispo"
    level = keys.get("importance_sampling_level") or "token"
    low, high = keys.get("epsilon"), keys.get("epsilon_high")
    shaping = {  # how ART shapes the ratio before it clips it
        "ratio_cap": keys.get("max_negative_advantage_importance_sampling_weight"),
        "mask_out_of_range": bool(keys.get("mask_prob_ratio", False)),
    }
    if name == "cispo":
        return CISPOLoss(
            clip_low=1.0 if low is None else low,
            clip_high=4.0 if high is None else high,
            importance_sampling_level=level,
            **shaping,
        )
    if name == "ppo":  # ART's PPO clips symmetrically unless epsilon_high is given
        low = 0.2 if low is None else low
        return PPOLoss(
            clip_low=low, clip_high=low if high is None else high, importance_sampling_level=level, **shaping
        )
    raise ConfigurationError(f"loss_fn={name!r}: ART's losses are 'cispo' and 'ppo' (agentrl adds DRO and GSPO)")


def agentrl_train_config(keys: Mapping[str, Any]) -> agentrl.TrainConfig:
    """The `agentrl.TrainConfig` that trains as ART does with these training keys (ART's defaults for
    the rest); raises `ConfigurationError` naming any key agentrl cannot honour."""
    _check_unsupported(keys)
    for key, default in INERT.items():
        if keys.get(key, default) != default:
            logger.warning("%s=%r changes nothing, in agentrl as in ART 0.5.18's LocalBackend (which applies it "
                           "nowhere): set learning_rate yourself", key, keys[key])  # fmt: skip
    packed = keys.get("packed_sequence_length")
    return agentrl.TrainConfig(
        learning_rate=keys.get("learning_rate", 5e-6),
        loss=_loss(keys),
        kl_coef=keys.get("beta") or 0.0,
        kl_advantage_coef=keys.get("kl_penalty_coef") or 0.0,
        kl_advantage_source=keys.get("kl_penalty_source") or "current_learner",
        advantage_logprob_tau=keys.get("kimi_k2_tau") or 0.0,
        advantage_balance=keys.get("advantage_balance") or 0.0,
        # ART's normalize_advantages=False centres rewards per group without dividing by their std, as scale_rewards=False.
        scale_advantages_by_std=bool(keys.get("scale_rewards", True)) and bool(keys.get("normalize_advantages", True)),
        allow_training_without_logprobs=bool(keys.get("allow_training_without_logprobs", False)),
        truncated_importance_sampling=keys.get("truncated_importance_sampling") or 0.0,
        micro_batch_tokens=packed,
    )


def merged_keys(config: TrainConfig | None, dev_config: Mapping[str, Any] | None) -> dict[str, Any]:
    """ART's older `model.train(config=..., _config=...)` as one set of training keys."""
    keys = dict(dev_config or {})
    if config is not None:
        keys.update(config.model_dump(exclude_unset=True))
    return keys


def log_verbose(verbose: bool, step: int, metrics: Mapping[str, float]) -> None:
    """ART's `verbose=True`: the step's metrics, logged at INFO."""
    if verbose:
        logger.info("step %d: %s", step, ", ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items())))
