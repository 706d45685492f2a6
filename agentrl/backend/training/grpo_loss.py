"""A GRPO step's loss, one micro-batch at a time, and the running sums its metrics come from.

The sums stay on the device until the step ends (one transfer for all of them, after the ranks have
added theirs), and become per-token metrics: clip fraction, entropy, the sampler-trainer gap and the
KL penalty.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from agentrl.config import TrainConfig
from agentrl.rl.losses import policy_loss
from agentrl.rl.tokenize import TokenBatch

SUM_NAMES = ("loss", "clipped", "kl_penalty", "entropy", "sampler_minus_trainer", "sampler_minus_trainer_sq")
"""The running sums of a GRPO step, added up over micro-batches (and ranks) before they become metrics."""


@dataclass
class GRPOLoss:
    """The policy loss of each micro-batch in turn (divided by the step's `denominator`), adding to
    `sums` all but the loss itself, which the passes add up."""

    config: TrainConfig
    denominator: float
    device: torch.device
    sums: dict[str, torch.Tensor] = field(init=False)

    def __post_init__(self) -> None:
        self.sums = {name: torch.zeros((), device=self.device) for name in SUM_NAMES}

    def __call__(
        self,
        batch: TokenBatch,
        logprobs_BT: torch.Tensor,
        entropy_N: torch.Tensor,
        ref_logprobs_BT: torch.Tensor | None,
    ) -> torch.Tensor:
        mask_BT = batch.loss_mask_BT[:, 1:]
        sampler_logprobs_BT = batch.sampler_logprobs_BT[:, 1:]
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
            truncated_importance_sampling=self.config.truncated_importance_sampling,
        )
        gap_BT = (sampler_logprobs_BT - logprobs_BT.detach()) * mask_BT
        self.sums["clipped"] += out.num_clipped
        self.sums["kl_penalty"] += out.kl_sum
        self.sums["entropy"] += entropy_N.sum()
        self.sums["sampler_minus_trainer"] += gap_BT.sum()
        self.sums["sampler_minus_trainer_sq"] += gap_BT.square().sum()
        return out.loss


def loss_metrics(sums: dict[str, float], num_loss_tokens: int) -> dict[str, float]:
    """The step's summed loss, and per trained token: the share of clipped tokens, entropy, the
    sampler-minus-trainer logprob gap (k1) and its k2 estimate, and the KL penalty."""
    n = max(num_loss_tokens, 1)
    return {
        "loss": sums["loss"],
        "clip_fraction": sums["clipped"] / n,
        "entropy": sums["entropy"] / n,
        "kl_sampler_trainer": sums["sampler_minus_trainer"] / n,
        "kl_sampler_trainer_sq": 0.5 * sums["sampler_minus_trainer_sq"] / n,
        "kl_penalty": sums["kl_penalty"] / n,
    }
