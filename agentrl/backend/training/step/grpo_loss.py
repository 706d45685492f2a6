"""A GRPO step's loss, one micro-batch at a time, and the running sums its metrics come from.

The sums stay on the device until the step ends (one transfer for all of them, after the ranks have
added theirs), and become per-token metrics: clip fraction, entropy, the sampler-trainer gap and the
KL penalty.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from agentrl.foundation.config import TrainConfig
from agentrl.rl.losses import KLAdvantage, policy_loss
from agentrl.rl.micro_batches import TokenBatch

SUM_NAMES = (
    "loss",
    "clipped",
    "kl_penalty",
    "kl_to_base",
    "entropy",
    "sampler_minus_trainer",
    "sampler_minus_trainer_sq",
    "mismatch_abs",
    "mismatch_over",
    "token_masked",
    "sequence_masked",
    "masked",
)
"""The running sums of a GRPO step, added up over micro-batches (and ranks) before they become metrics."""
MAX_NAMES = ("mismatch_abs_max",)
"""The step's running maxima: the largest over micro-batches (and ranks)."""
MISMATCH_THRESHOLD = 0.2
"""|log p_sampler - log p_trainer| above which a token counts in `mismatch_over_threshold` (a ratio
outside about [0.82, 1.22]): bf16 rounding alone stays well under it."""


@dataclass
class GRPOLoss:
    """The policy loss of each micro-batch in turn (divided by the step's `denominator`), adding to
    `sums` all but the loss itself, which the passes add up, and keeping the `MAX_NAMES` maxima."""

    config: TrainConfig
    denominator: float
    device: torch.device
    sums: dict[str, torch.Tensor] = field(init=False)

    def __post_init__(self) -> None:
        self.sums = {name: torch.zeros((), device=self.device) for name in SUM_NAMES + MAX_NAMES}

    @property
    def kl_advantage(self) -> KLAdvantage | None:
        """ART's advantage shaping, where the config asks for it."""
        c = self.config
        if not (c.kl_advantage_coef or c.advantage_logprob_tau):
            return None
        return KLAdvantage(c.kl_advantage_coef, c.kl_advantage_source, c.advantage_logprob_tau)

    def __call__(
        self,
        batch: TokenBatch,
        logprobs_BT: torch.Tensor,
        entropy_N: torch.Tensor,
        ref_logprobs_BT: torch.Tensor | None,
    ) -> torch.Tensor:
        mask_BT = batch.loss_mask_BT[:, 1:]
        sampler_logprobs_BT = batch.sampler_logprobs_BT[:, 1:]
        if self.config.nonfinite_logprobs_as_missing:  # ART's: such a token's ratio is 1, as if sampled by the trainer
            sampler_logprobs_BT = torch.where(
                torch.isfinite(sampler_logprobs_BT),
                sampler_logprobs_BT,
                logprobs_BT.detach().to(sampler_logprobs_BT.dtype),
            )
        out = policy_loss(
            self.config.loss,
            logprobs_BT,
            sampler_logprobs_BT,
            batch.advantages_BT[:, 1:],
            mask_BT,
            denominator=self.denominator,
            ref_logprobs_BT=ref_logprobs_BT,
            kl_coef=self.config.kl_coef,
            kl_estimator=self.config.kl_estimator,
            kl_advantage=self.kl_advantage,
            truncated_importance_sampling=self.config.truncated_importance_sampling,
            token_mask_bounds=self.config.mismatch_token_mask,
            sequence_mask_bounds=self.config.mismatch_sequence_mask,
        )
        gap_BT = (sampler_logprobs_BT - logprobs_BT.detach()) * mask_BT
        abs_gap_BT = gap_BT.abs()
        self.sums["mismatch_abs"] += abs_gap_BT.sum()
        self.sums["mismatch_over"] += (abs_gap_BT > MISMATCH_THRESHOLD).sum()
        self.sums["mismatch_abs_max"] = torch.maximum(self.sums["mismatch_abs_max"], abs_gap_BT.max())
        self.sums["token_masked"] += out.num_token_masked
        self.sums["sequence_masked"] += out.num_sequence_masked
        self.sums["masked"] += out.num_masked
        self.sums["clipped"] += out.num_clipped
        self.sums["kl_penalty"] += out.kl_sum
        self.sums["kl_to_base"] += out.kl_to_base_sum
        self.sums["entropy"] += entropy_N.sum()
        self.sums["sampler_minus_trainer"] += gap_BT.sum()
        self.sums["sampler_minus_trainer_sq"] += gap_BT.square().sum()
        return out.loss


def loss_metrics(sums: dict[str, float], num_loss_tokens: int) -> dict[str, float]:
    """The step's summed loss, and per trained token: the share of clipped tokens, entropy, the
    sampler-minus-trainer logprob gap (k1 and k2 KL estimates; its mean and largest absolute value and
    the share of tokens over `MISMATCH_THRESHOLD`), the KL penalty, and the shares the mismatch masks
    left out."""
    n = max(num_loss_tokens, 1)
    return {
        "loss": sums["loss"],
        "clip_fraction": sums["clipped"] / n,
        "entropy": sums["entropy"] / n,
        "kl_sampler_trainer": sums["sampler_minus_trainer"] / n,
        "kl_sampler_trainer_sq": 0.5 * sums["sampler_minus_trainer_sq"] / n,
        "mismatch_abs_mean": sums["mismatch_abs"] / n,
        "mismatch_abs_max": sums["mismatch_abs_max"],
        "mismatch_over_threshold": sums["mismatch_over"] / n,
        "token_mask_fraction": sums["token_masked"] / n,
        "sequence_mask_fraction": sums["sequence_masked"] / n,
        "kl_penalty": sums["kl_penalty"] / n,
        "kl_policy_ref": sums["kl_to_base"] / n,  # ART's name: the mean KL that `kl_advantage_coef` shapes by
    }
