"""Policy losses and KL estimators, per token. Pure torch, no I/O.

Shapes: `_B` sequences in a micro-batch, `_T` token positions. Every `*_BT` tensor is aligned so
that position t holds the log-probability of token t given tokens < t; `mask_BT` is 1 on tokens
that carry loss (sampled assistant tokens) and 0 elsewhere. `advantages_BT` repeats each
trajectory's advantage over its tokens.

Each policy loss returns the per-token loss (before normalisation) and which tokens its clipping
touched. `policy_loss` adds the optional KL penalty, truncated importance sampling and the
sampler/trainer mismatch masks, then normalises by tokens (DAPO) or by a constant (Dr. GRPO).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from agentrl.foundation.config import (
    CISPOLoss,
    DROLoss,
    GSPOLoss,
    ImportanceSamplingLevel,
    ImportanceSamplingLoss,
    LossConfig,
    PPOLoss,
)


@dataclass(frozen=True)
class TokenLoss:
    """A policy loss per token, and where clipping changed the objective."""

    loss_BT: torch.Tensor
    clipped_BT: torch.Tensor  # bool


LOG_RATIO_BOUND = 20.0
"""|log(p / p_old)| is clamped to this before exp() (ART's bound): a ratio of e^20 already saturates every clip."""


def masked_log_ratio(logprobs_BT: torch.Tensor, old_logprobs_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """log(p / p_old) on loss tokens, clamped to +-`LOG_RATIO_BOUND`; 0 elsewhere (so exp() of padding never
    overflows)."""
    log_ratio_BT = (logprobs_BT - old_logprobs_BT).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    return torch.where(mask_BT.bool(), log_ratio_BT, torch.zeros_like(logprobs_BT))


def importance_ratio(
    level: ImportanceSamplingLevel, logprobs_BT: torch.Tensor, old_logprobs_BT: torch.Tensor, mask_BT: torch.Tensor
) -> torch.Tensor:
    """p / p_old per token at `level`: the token's own ratio, its sequence's (the geometric mean of the
    sequence's token ratios, so long and short answers compare alike), or the arithmetic or geometric
    mean of the two. Each row of `_BT` is one sequence; padding gets ratio 1."""
    log_ratio_BT = masked_log_ratio(logprobs_BT, old_logprobs_BT, mask_BT)
    if level == "token":
        return log_ratio_BT.exp()
    tokens_B1 = mask_BT.sum(dim=1, keepdim=True).clamp(min=1)
    seq_log_ratio_B1 = log_ratio_BT.sum(dim=1, keepdim=True) / tokens_B1
    if level == "sequence":
        return seq_log_ratio_B1.exp().expand_as(log_ratio_BT)
    if level == "average":
        return (log_ratio_BT.exp() + seq_log_ratio_B1.exp()) / 2
    return ((log_ratio_BT + seq_log_ratio_B1) / 2).exp()  # geometric_average: sqrt(token ratio * sequence ratio)


def arts_ratio(cfg: PPOLoss | CISPOLoss, ratio_BT: torch.Tensor) -> torch.Tensor:
    """The ratio as ART shapes it before clipping: capped at `ratio_cap`, then zeroed outside the clip range with
    `mask_out_of_range` (both off by default)."""
    if cfg.ratio_cap is not None:
        ratio_BT = ratio_BT.clamp(max=cfg.ratio_cap)
    if cfg.mask_out_of_range:
        inside_BT = (ratio_BT > 1 - cfg.clip_low) & (ratio_BT < 1 + cfg.clip_high)
        ratio_BT = torch.where(inside_BT, ratio_BT, torch.zeros_like(ratio_BT))
    return ratio_BT


@functools.singledispatch
def token_loss(
    cfg: object,
    logprobs_BT: torch.Tensor,
    old_logprobs_BT: torch.Tensor,
    advantages_BT: torch.Tensor,
    mask_BT: torch.Tensor,
) -> TokenLoss:
    """The per-token policy loss the loss config `cfg` names: each loss function below registers for its
    config type, so the configs in `agentrl.foundation.config.LossConfig` are the one list of losses."""
    raise TypeError(f"no policy loss is registered for {type(cfg).__name__}; register one with @token_loss.register")


@token_loss.register
def importance_sampling_loss(
    cfg: ImportanceSamplingLoss,
    logprobs_BT: torch.Tensor,
    old_logprobs_BT: torch.Tensor,
    advantages_BT: torch.Tensor,
    mask_BT: torch.Tensor,
) -> TokenLoss:
    ratio_BT = importance_ratio(cfg.importance_sampling_level, logprobs_BT, old_logprobs_BT, mask_BT)
    return TokenLoss(-ratio_BT * advantages_BT, torch.zeros_like(mask_BT, dtype=torch.bool))


@token_loss.register
def ppo_loss(
    cfg: PPOLoss,
    logprobs_BT: torch.Tensor,
    old_logprobs_BT: torch.Tensor,
    advantages_BT: torch.Tensor,
    mask_BT: torch.Tensor,
) -> TokenLoss:
    ratio_BT = arts_ratio(cfg, importance_ratio(cfg.importance_sampling_level, logprobs_BT, old_logprobs_BT, mask_BT))
    unclipped_BT = ratio_BT * advantages_BT
    clipped_BT = ratio_BT.clamp(1 - cfg.clip_low, 1 + cfg.clip_high) * advantages_BT
    # The pessimistic bound: clipping only ever removes incentive, never adds it.
    return TokenLoss(-torch.minimum(unclipped_BT, clipped_BT), clipped_BT < unclipped_BT)


@token_loss.register
def cispo_loss(
    cfg: CISPOLoss,
    logprobs_BT: torch.Tensor,
    old_logprobs_BT: torch.Tensor,
    advantages_BT: torch.Tensor,
    mask_BT: torch.Tensor,
) -> TokenLoss:
    ratio_BT = arts_ratio(cfg, importance_ratio(cfg.importance_sampling_level, logprobs_BT, old_logprobs_BT, mask_BT))
    weight_BT = ratio_BT.clamp(1 - cfg.clip_low, 1 + cfg.clip_high).detach()
    # Unlike PPO, a clipped token still gets a gradient, just a bounded one.
    is_clipped_BT = (ratio_BT < 1 - cfg.clip_low) | (ratio_BT > 1 + cfg.clip_high)
    return TokenLoss(-weight_BT * advantages_BT * logprobs_BT, is_clipped_BT)


@token_loss.register
def dro_loss(
    cfg: DROLoss,
    logprobs_BT: torch.Tensor,
    old_logprobs_BT: torch.Tensor,
    advantages_BT: torch.Tensor,
    mask_BT: torch.Tensor,
) -> TokenLoss:
    log_ratio_BT = masked_log_ratio(logprobs_BT, old_logprobs_BT, mask_BT)
    objective_BT = logprobs_BT * advantages_BT - 0.5 * cfg.beta * log_ratio_BT.square()
    return TokenLoss(-objective_BT, torch.zeros_like(mask_BT, dtype=torch.bool))


@token_loss.register
def gspo_loss(
    cfg: GSPOLoss,
    logprobs_BT: torch.Tensor,
    old_logprobs_BT: torch.Tensor,
    advantages_BT: torch.Tensor,
    mask_BT: torch.Tensor,
) -> TokenLoss:
    seq_ratio_BT = importance_ratio("sequence", logprobs_BT, old_logprobs_BT, mask_BT)
    unclipped_BT = seq_ratio_BT * advantages_BT
    clipped_BT = seq_ratio_BT.clamp(1 - cfg.clip_low, 1 + cfg.clip_high) * advantages_BT
    return TokenLoss(-torch.minimum(unclipped_BT, clipped_BT), clipped_BT < unclipped_BT)


# --- KL(policy || reference) per token, from samples of the policy (Schulman, "Approximating KL") ---


def kl_k1(logprobs_BT: torch.Tensor, ref_logprobs_BT: torch.Tensor) -> torch.Tensor:
    """log(p / p_ref): unbiased, high variance, can be negative."""
    return logprobs_BT - ref_logprobs_BT


def kl_k2(logprobs_BT: torch.Tensor, ref_logprobs_BT: torch.Tensor) -> torch.Tensor:
    """0.5 * log(p_ref / p)^2: biased, low variance, never negative."""
    return 0.5 * (ref_logprobs_BT - logprobs_BT).square()


def kl_k3(logprobs_BT: torch.Tensor, ref_logprobs_BT: torch.Tensor) -> torch.Tensor:
    """p_ref/p - 1 - log(p_ref/p): unbiased, low variance, never negative."""
    log_ratio_BT = ref_logprobs_BT - logprobs_BT
    return log_ratio_BT.exp() - 1 - log_ratio_BT


KL_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}


def loss_denominator(
    mode: Literal["tokens", "all_tokens", "constant"],
    *,
    num_tokens: int,
    num_sequences: int,
    constant: int,
    num_zero_variance_tokens: int = 0,
) -> float:
    """What the summed token losses of a whole step are divided by.

    "tokens" (DAPO): every trained token weighs the same. "all_tokens" (TRL's GRPO): the trained
    tokens and those of the step's zero-variance groups, which carry no loss, so a step whose groups
    are mostly solved moves the policy less. "constant" (Dr. GRPO): sequences x a fixed budget, so a
    response's length does not change how much each of its tokens counts.
    Computed once per step, so gradient accumulation over micro-batches gives the same update.
    """
    if mode == "tokens":
        return float(max(num_tokens, 1))
    if mode == "all_tokens":
        return float(max(num_tokens + num_zero_variance_tokens, 1))
    return float(max(num_sequences, 1) * constant)


@dataclass(frozen=True)
class MismatchMasks:
    """Which loss tokens the off-policy masks leave out: by their own ratio, by their sequence's."""

    token_masked_BT: torch.Tensor  # bool
    sequence_masked_BT: torch.Tensor  # bool

    @property
    def keep_BT(self) -> torch.Tensor:
        return ~(self.token_masked_BT | self.sequence_masked_BT)


def mismatch_masks(
    logprobs_BT: torch.Tensor,
    sampler_logprobs_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    token_bounds: tuple[float, float] | None,
    sequence_bounds: tuple[float, float] | None,
) -> MismatchMasks:
    """The loss tokens whose ratio p_trainer/p_sampler lies outside `token_bounds` (IcePop), and those of
    sequences whose geometric-mean ratio lies outside `sequence_bounds`; None: that mask is off. Each
    row of `_BT` is one sequence; the trainer's logprobs are taken as they are (pass them detached)."""
    log_ratio_BT = masked_log_ratio(logprobs_BT, sampler_logprobs_BT, mask_BT)
    on_BT = mask_BT.bool()
    none_BT = torch.zeros_like(on_BT)
    token_masked_BT = none_BT
    if token_bounds is not None:
        low, high = math.log(token_bounds[0]), math.log(token_bounds[1])
        token_masked_BT = on_BT & ((log_ratio_BT < low) | (log_ratio_BT > high))
    sequence_masked_BT = none_BT
    if sequence_bounds is not None:
        low, high = math.log(sequence_bounds[0]), math.log(sequence_bounds[1])
        seq_log_ratio_B1 = log_ratio_BT.sum(dim=1, keepdim=True) / mask_BT.sum(dim=1, keepdim=True).clamp(min=1)
        sequence_masked_BT = on_BT & ((seq_log_ratio_B1 < low) | (seq_log_ratio_B1 > high))
    return MismatchMasks(token_masked_BT, sequence_masked_BT)


@dataclass(frozen=True)
class LossOutput:
    """A micro-batch's share of the step loss, and sums for the step's metrics."""

    # All scalars stay tensors on the loss's device: reading them (`float()`) would sync a GPU
    # every micro-batch, and the trainer sums them on the device and reads them once per step.
    loss: torch.Tensor  # scalar, already divided by the step's denominator
    num_clipped: torch.Tensor  # scalar: loss tokens where clipping changed the objective
    kl_sum: torch.Tensor  # scalar: summed KL penalty estimate over loss tokens (0 when off)
    num_token_masked: torch.Tensor  # scalar: loss tokens the token mismatch mask left out
    num_sequence_masked: torch.Tensor  # scalar: loss tokens the sequence mismatch mask left out
    num_masked: torch.Tensor  # scalar: loss tokens either mask left out (the ledger's `masked`)
    kl_to_base_sum: (
        torch.Tensor
    )  # scalar: summed (source - base) logprob over loss tokens, where advantages are shaped by it


@dataclass(frozen=True)
class KLAdvantage:
    """ART's advantage shaping (`kl_penalty_coef`, `kimi_k2_tau`): terms added to each token's advantage before the
    policy loss, every one detached, so they steer the update without a gradient of their own."""

    coef: float = 0.0
    """kl_advantage_coef: + coef * (mean kl - kl), kl = source - base logprob per loss token."""
    source: str = "current_learner"
    """"current_learner" (the trainer's logprobs) or "sample" (the sampler's)."""
    tau: float = 0.0
    """advantage_logprob_tau: - tau * (trainer - old logprob)."""

    def shaped(
        self,
        advantages_BT: torch.Tensor,
        logprobs_BT: torch.Tensor,
        sampler_logprobs_BT: torch.Tensor,
        old_logprobs_BT: torch.Tensor,
        ref_logprobs_BT: torch.Tensor | None,
        mask_BT: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The shaped advantages [B, T], and the summed kl over loss tokens (0 without `coef`)."""
        kl_sum = logprobs_BT.new_zeros(())
        if self.coef > 0:
            if ref_logprobs_BT is None:
                raise ValueError("kl_advantage_coef > 0 needs ref_logprobs_BT (the base model's logprobs)")
            source_BT = logprobs_BT.detach() if self.source == "current_learner" else sampler_logprobs_BT
            kl_BT = (source_BT - ref_logprobs_BT).detach() * mask_BT
            kl_sum = kl_BT.sum()
            mean_kl = kl_sum / mask_BT.sum().clamp(min=1)
            advantages_BT = advantages_BT + self.coef * (mean_kl - kl_BT) * mask_BT
        if self.tau > 0:
            advantages_BT = advantages_BT - self.tau * (logprobs_BT.detach() - old_logprobs_BT) * mask_BT
        return advantages_BT, kl_sum


def policy_loss(
    loss_cfg: LossConfig,
    logprobs_BT: torch.Tensor,
    sampler_logprobs_BT: torch.Tensor,
    advantages_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    denominator: float,
    ref_logprobs_BT: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: Literal["k1", "k2", "k3"] = "k3",
    kl_advantage: KLAdvantage | None = None,
    truncated_importance_sampling: float = 0.0,
    token_mask_bounds: tuple[float, float] | None = None,
    sequence_mask_bounds: tuple[float, float] | None = None,
) -> LossOutput:
    """The full per-micro-batch loss: policy loss, optional TIS and KL penalty, normalised.

    With `truncated_importance_sampling` = C > 0 the old policy is the trainer itself (detached)
    and each token is weighted by min(p_trainer / p_sampler, C), correcting sampler/trainer
    mismatch without letting rare tokens blow up the update. The mismatch masks (`mismatch_masks`)
    leave tokens out of the loss instead; the denominator stays the step's, so a masked token
    counts as a token with zero loss.
    """
    masks = mismatch_masks(
        logprobs_BT.detach(),
        sampler_logprobs_BT,
        mask_BT,
        token_bounds=token_mask_bounds,
        sequence_bounds=sequence_mask_bounds,
    )
    mask_BT = mask_BT.to(logprobs_BT.dtype)
    kept_BT = mask_BT * masks.keep_BT.to(mask_BT.dtype)
    old_logprobs_BT = logprobs_BT.detach() if truncated_importance_sampling > 0 else sampler_logprobs_BT
    kl_to_base = None
    if kl_advantage is not None:
        advantages_BT, kl_to_base = kl_advantage.shaped(advantages_BT, logprobs_BT, sampler_logprobs_BT,
                                                        old_logprobs_BT, ref_logprobs_BT, mask_BT)  # fmt: skip
    per_token = token_loss(loss_cfg, logprobs_BT, old_logprobs_BT, advantages_BT, mask_BT)
    loss_BT = per_token.loss_BT
    if truncated_importance_sampling > 0:
        tis_weight_BT = masked_log_ratio(logprobs_BT.detach(), sampler_logprobs_BT, mask_BT).exp()
        loss_BT = loss_BT * tis_weight_BT.clamp(max=truncated_importance_sampling)
    kl_sum = logprobs_BT.new_zeros(())
    if kl_coef > 0:
        if ref_logprobs_BT is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs_BT (the base model's logprobs)")
        kl_BT = KL_ESTIMATORS[kl_estimator](logprobs_BT, ref_logprobs_BT) * kept_BT
        loss_BT = loss_BT + kl_coef * kl_BT
        kl_sum = kl_BT.detach().sum()
    loss = (loss_BT * kept_BT).sum() / denominator
    num_clipped = (per_token.clipped_BT & kept_BT.bool()).sum()
    return LossOutput(
        loss=loss,
        num_clipped=num_clipped,
        kl_sum=kl_sum,
        kl_to_base_sum=logprobs_BT.new_zeros(()) if kl_to_base is None else kl_to_base,
        num_token_masked=masks.token_masked_BT.sum(),
        num_sequence_masked=masks.sequence_masked_BT.sum(),
        num_masked=(masks.token_masked_BT | masks.sequence_masked_BT).sum(),
    )
