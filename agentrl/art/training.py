"""ART's training settings and what each becomes in `agentrl.TrainConfig`.

ART 0.5 passes them as keywords of `backend.train(model, groups, ...)`; older scripts as
`model.train(groups, config=art.TrainConfig(...), _config=art.dev.TrainConfig(...))`. Both reach
`agentrl_train_config`, which maps every key that changes training the way ART changes it and
raises, naming the key, for a key agentrl has no counterpart of. A key at ART's default is
accepted either way: it asks for nothing. ART's default loss is CISPO with epsilon 1.0 / 4.0.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

import agentrl
from agentrl.foundation.config import CISPOLoss, PPOLoss
from agentrl.foundation.errors import ConfigurationError

logger = logging.getLogger(__name__)


class TrainConfig(BaseModel):
    """ART's `art.TrainConfig`: the learning rate and the KL penalty (`beta` in scripts before 0.5.11)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    learning_rate: float = Field(default=5e-6, gt=0)
    kl_penalty_coef: float = Field(default=0.0, ge=0)
    """ART's KL penalty: it shapes the advantages by the KL to the base model (agentrl's `kl_advantage_coef`)."""
    kl_penalty_source: Literal["current_learner", "sample"] = "current_learner"
    grad_accumulation_sequences: int | None = Field(default=None, ge=1)
    optimizer_save_interval: int = Field(default=5, ge=1)
    """ART 0.5.20+: how often Megatron saves its optimizer; agentrl saves it with every checkpoint."""
    final_training_step: int | None = Field(default=None, ge=1)
    """ART 0.5.20+: the last step of Megatron's schedule; changes nothing on ART's LocalBackend or here."""
    beta: float = Field(default=0.0, ge=0)
    """ART's KL penalty before 0.5.11, a loss term to the reference (agentrl's `kl_coef`)."""


# Keys that change training: ART's default for each (a key at its default asks for nothing), and what it becomes.
MAPPED: dict[str, tuple[Any, str]] = {
    "learning_rate": (5e-6, "`learning_rate`"),
    "loss_fn": ("cispo", "`loss`: `CISPOLoss` or `PPOLoss`"),
    "ppo": (False, "`loss=PPOLoss(...)`"),
    "epsilon": (None, "the loss's `clip_low` (CISPO 1.0, PPO 0.2 when None)"),
    "epsilon_high": (None, "the loss's `clip_high` (CISPO 4.0, PPO = epsilon when None)"),
    "importance_sampling_level": ("token", "the loss's `importance_sampling_level`"),
    "kl_penalty_coef": (0.0, "`kl_advantage_coef` (the advantages shaped by the KL to the reference)"),
    "beta": (0.0, "`kl_coef` (a KL loss term; ART before 0.5.11)"),
    "kl_penalty_source": ("current_learner", "`kl_advantage_source`"),
    "scale_rewards": (True, "`scale_advantages_by_std`"),
    "kimi_k2_tau": (None, "`advantage_logprob_tau`"),
    "advantage_balance": (0.0, "`advantage_balance`"),
    "max_negative_advantage_importance_sampling_weight": (None, "the loss's `ratio_cap`"),
    "mask_prob_ratio": (False, "the loss's `mask_out_of_range`"),
    "normalize_advantages": (True, "`scale_advantages_by_std` (False: centred only)"),
    "allow_training_without_logprobs": (False, "`allow_training_without_logprobs`"),
    "truncated_importance_sampling": (None, "`truncated_importance_sampling`"),
    "packed_sequence_length": (None, "`micro_batch_tokens`"),
    "kl_penalty_reference_step": (None, "`kl_reference` (a step)"),
    "kl_ref_adapter_path": (None, "`kl_reference` (an adapter folder)"),
    "kl_penalty_step_lag": (None, "`kl_reference` (negative: steps back from the one trained)"),
    "num_trajectories_learning_rate_multiplier_power": (0.0, "`learning_rate_sequence_power` (1 ** power per step)"),
    "save_checkpoint": (True, "False: the result names no checkpoint"),
    "verbose": (False, "the step's metrics logged at INFO"),
}
# Keys that only change how ART computes (memory, speed), not what it learns: accepted, nothing to do.
COMPUTE_ONLY = ("logprob_calculation_chunk_size", "precalculate_logprobs", "plot_tensors")
# ART 0.5.20+'s keys for Megatron's optimizer snapshots and schedule: ART's LocalBackend passes them on and applies
# them nowhere (agentrl saves the optimizer state with every checkpoint); checked as ART checks them (>= 1).
MEGATRON_ONLY = ("optimizer_save_interval", "final_training_step")
# Keys ART 0.5.18's LocalBackend takes and applies nowhere (its Model.train did, and is gone): accepted as ART accepts
# them, with a warning that says so.
INERT = {"scale_learning_rate_by_reward_std_dev": False}
# Keys agentrl has no counterpart for: only the values listed (ART's default, and what ART's LocalBackend also
# accepts) pass; otherwise what to do instead.
UNSUPPORTED: dict[str, tuple[tuple[Any, ...], str]] = {
    "loss_fn_config": (
        (None,),
        "ART's own LocalBackend refuses it too; choose the loss with loss_fn and its clips with epsilon/epsilon_high",
    ),
    "megatron_topology": ((None,), "agentrl trains with torch.distributed ranks (LocalBackend(ranks=...))"),
    "grad_accumulation_sequences": (
        (None, 1),
        "ART's LocalBackend accepts only its configured 1 (one optimizer step per trajectory), as agentrl.art does; "
        "agentrl's own TrainConfig accumulates by tokens (micro_batch_tokens)",
    ),
    "adam_params": (
        (None,),
        "ART's LocalBackend refuses it too (only its Tinker-native backend takes it) and trains with AdamW (0.9, 0.99), "
        "weight decay 0.1, clip 0.1; for other settings train with agentrl.TrainConfig(adam_betas=..., "
        "weight_decay=..., max_grad_norm=...)",
    ),
}
TRAIN_KEYS = (*MAPPED, *COMPUTE_ONLY, *MEGATRON_ONLY, *INERT, *UNSUPPORTED)


def _check_unsupported(keys: Mapping[str, Any]) -> None:
    unknown = sorted(set(keys) - set(TRAIN_KEYS))
    if unknown:
        raise ConfigurationError(
            f"ART training keys {unknown} are not ART's (0.5.18 to 0.5.23); the keys are {sorted(TRAIN_KEYS)}"
        )
    for key in MEGATRON_ONLY:
        value = keys.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigurationError(f"{key}={value!r}: ART takes an int >= 1 (or None for final_training_step)")
    for key, (accepted, instead) in UNSUPPORTED.items():
        if key in keys and keys[key] not in accepted:
            raise ConfigurationError(
                f"{key}={keys[key]!r} has no counterpart in agentrl (accepted: {', '.join(map(repr, accepted))}): "
                f"{instead}"
            )


ART_OPTIMIZER: dict[str, Any] = {
    "optimizer_step_per": "sequence",
    "adam_betas": (0.9, 0.99),
    "weight_decay": 0.1,
    "max_grad_norm": 0.1,
}
"""How ART's LocalBackend steps its optimizer: one step per trajectory (Unsloth trains one sequence at a time with no
gradient accumulation), AdamW betas (0.9, 0.99), weight decay 0.1, gradient norm clipped to 0.1. ART's AdamW is
paged 8-bit, which needs a GPU; agentrl's is 32-bit with the same settings."""


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
        **ART_OPTIMIZER,
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
        nonfinite_logprobs_as_missing=True,
    )


ART_TRAIN_METRICS = {
    "loss": "loss/train",
    "entropy": "loss/entropy",
    "kl_penalty": "loss/kl_div",
    "kl_policy_ref": "loss/kl_policy_ref",
    "grad_norm": "loss/grad_norm",
    "learning_rate": "loss/learning_rate",
    "clip_fraction": "loss/clipped_token_fraction",
    "train_s": "time/step_backend_train_s",
    "trained_tokens": "data/step_trainable_assistant_tokens",
}
"""agentrl's name of a training metric -> ART 0.5.20+'s (its W&B sections `loss/`, `time/`, `data/`)."""


def with_art_train_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """A step's metrics with ART 0.5.20+'s names added beside agentrl's (the zero-variance groups as
    `discarded/step/zero_variance_groups`), so a script that logs `result.metrics` charts what ART's charts."""
    named = dict(metrics)
    for ours, arts in ART_TRAIN_METRICS.items():
        if ours in metrics:
            named.setdefault(arts, metrics[ours])
    if "frac_zero_variance_groups" in metrics and "num_groups" in metrics:
        named.setdefault(
            "discarded/step/zero_variance_groups",
            float(round(metrics["frac_zero_variance_groups"] * metrics["num_groups"])),
        )
    return named


def art_names_of(recorded: Iterable[str]) -> set[str]:
    """ART's names (`with_art_train_metrics`) of the metrics a step recorded under agentrl's: already recorded."""
    names = {ART_TRAIN_METRICS[name] for name in recorded if name in ART_TRAIN_METRICS}
    return names | ({"discarded/step/zero_variance_groups"} if "frac_zero_variance_groups" in recorded else set())


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
