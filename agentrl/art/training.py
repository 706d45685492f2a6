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
    "adam_params": None,
    "kl_penalty_reference_step": None,
    "kl_ref_adapter_path": None,
    "kl_penalty_step_lag": None,
    "num_trajectories_learning_rate_multiplier_power": 0.0,
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


ADAM_PARAMS = ("learning_rate", "beta1", "beta2", "eps", "weight_decay", "grad_clip_norm")
"""The fields of ART's `adam_params` (Tinker's `AdamParams`)."""


def _adam(adam_params: Any) -> dict[str, Any]:
    """`agentrl.TrainConfig` settings from ART's `adam_params`: a Tinker `AdamParams` or a dict of its fields.
    Its learning rate wins over `learning_rate` and its `grad_clip_norm` (0: none) sets the clipping, as Tinker
    applies them; a field it leaves out keeps agentrl's value."""
    if adam_params is None:
        return {}
    if isinstance(adam_params, Mapping):
        given = dict(adam_params)
        if unknown := sorted(set(given) - set(ADAM_PARAMS)):
            raise ConfigurationError(f"adam_params keys {unknown} are not Adam's; the keys are {list(ADAM_PARAMS)}")
    else:
        given = {
            name: getattr(adam_params, name) for name in ADAM_PARAMS if getattr(adam_params, name, None) is not None
        }
    settings: dict[str, Any] = {}
    if "learning_rate" in given:
        settings["learning_rate"] = given["learning_rate"]
    if "beta1" in given or "beta2" in given:
        beta1, beta2 = agentrl.TrainConfig.model_fields["adam_betas"].default  # a beta left out keeps agentrl's
        settings["adam_betas"] = (given.get("beta1", beta1), given.get("beta2", beta2))
    if "eps" in given:
        settings["adam_eps"] = given["eps"]
    if "weight_decay" in given:
        settings["weight_decay"] = given["weight_decay"]
    if "grad_clip_norm" in given:
        settings["max_grad_norm"] = given["grad_clip_norm"]
    return settings


def _kl_reference(keys: Mapping[str, Any]) -> int | str | None:
    """ART's KL reference: an adapter folder, a checkpoint step, or (PipelineTrainer) a lag behind the step being
    trained; the base model (agentrl's None, the same as ART's untrained step 0) otherwise. Only with a KL penalty on,
    as ART resolves it only then."""
    if not (keys.get("kl_penalty_coef") or keys.get("beta")):
        return None
    if keys.get("kl_ref_adapter_path") is not None:
        return str(keys["kl_ref_adapter_path"])
    if keys.get("kl_penalty_reference_step") is not None:
        return int(keys["kl_penalty_reference_step"])
    if keys.get("kl_penalty_step_lag") is not None:  # ART: max(0, step trained from - lag)
        return -(int(keys["kl_penalty_step_lag"]) + 1)
    return None


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
    settings = {
        "learning_rate": keys.get("learning_rate", 5e-6),
        "learning_rate_sequence_power": keys.get("num_trajectories_learning_rate_multiplier_power") or 0.0,
        **_adam(keys.get("adam_params")),
    }
    return agentrl.TrainConfig(
        **settings,
        loss=_loss(keys),
        kl_coef=keys.get("beta") or 0.0,
        kl_advantage_coef=keys.get("kl_penalty_coef") or 0.0,
        kl_advantage_source=keys.get("kl_penalty_source") or "current_learner",
        kl_reference=_kl_reference(keys),
        advantage_logprob_tau=keys.get("kimi_k2_tau") or 0.0,
        advantage_balance=keys.get("advantage_balance") or 0.0,
        scale_advantages_by_mean_abs=True,  # ART's packing always divides by the mean |advantage|
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
