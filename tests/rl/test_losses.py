"""Each loss and KL estimator against values worked out by hand, plus property tests.

The reference case (one sequence, four loss tokens, sampler probability 0.5 each):
    ratios r     = [1.5, 0.5, 1.1, 0.7]      (trainer / sampler)
    advantages A = [ 1,   1,  -1,  -1 ]
With PPO clip [0.8, 1.28]: token 0 is clipped from above (A > 0), token 3 from below (A < 0).
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.foundation.config import CISPOLoss, DROLoss, GSPOLoss, ImportanceSamplingLoss, PPOLoss
from agentrl.rl.losses import KL_ESTIMATORS, KLAdvantage, loss_denominator, mismatch_masks, policy_loss

RATIOS = [1.5, 0.5, 1.1, 0.7]
ADVANTAGES = [1.0, 1.0, -1.0, -1.0]
SAMPLER_P = 0.5


def reference_case():
    # float64, so hand-computed sums with cancellation compare at pytest.approx's default tolerance
    old_BT = torch.full((1, 4), math.log(SAMPLER_P), dtype=torch.float64)
    logprobs_BT = torch.tensor([[math.log(r * SAMPLER_P) for r in RATIOS]], dtype=torch.float64, requires_grad=True)
    advantages_BT = torch.tensor([ADVANTAGES], dtype=torch.float64)
    mask_BT = torch.ones(1, 4, dtype=torch.float64)
    return logprobs_BT, old_BT, advantages_BT, mask_BT


def run(loss_cfg, denominator=4.0, **kwargs):
    logprobs_BT, old_BT, advantages_BT, mask_BT = reference_case()
    out = policy_loss(loss_cfg, logprobs_BT, old_BT, advantages_BT, mask_BT, denominator=denominator, **kwargs)
    out.loss.backward()
    return out, logprobs_BT.grad[0].tolist()


def test_importance_sampling_by_hand():
    out, grad = run(ImportanceSamplingLoss())
    # loss_t = -r_t A_t ; d/dlogp = -r_t A_t
    assert out.loss.item() == pytest.approx((-1.5 - 0.5 + 1.1 + 0.7) / 4)
    assert grad == pytest.approx([-1.5 / 4, -0.5 / 4, 1.1 / 4, 0.7 / 4])
    assert out.num_clipped == 0


def test_ppo_by_hand_including_both_clipped_branches():
    out, grad = run(PPOLoss(clip_low=0.2, clip_high=0.28))
    # t0: min(1.5, 1.28) = 1.28 (clipped high, no grad); t1: min(0.5, 0.8) = 0.5 (unclipped)
    # t2: min(-1.1, -1.1) (inside); t3: min(-0.7, -0.8) = -0.8 (clipped low, no grad)
    assert out.loss.item() == pytest.approx((-1.28 - 0.5 + 1.1 + 0.8) / 4)
    assert grad == pytest.approx([0.0, -0.5 / 4, 1.1 / 4, 0.0])
    assert out.num_clipped == 2


def test_cispo_by_hand_clipped_tokens_keep_a_bounded_gradient():
    out, grad = run(CISPOLoss(clip_low=0.2, clip_high=0.28))
    weights = [1.28, 0.8, 1.1, 0.8]  # clamp(r, 0.8, 1.28), no gradient through it
    logps = [math.log(r * SAMPLER_P) for r in RATIOS]
    expected_loss = -sum(w * a * lp for w, a, lp in zip(weights, ADVANTAGES, logps)) / 4
    assert out.loss.item() == pytest.approx(expected_loss)
    assert grad == pytest.approx([-1.28 / 4, -0.8 / 4, 1.1 / 4, 0.8 / 4])
    assert out.num_clipped == 3  # 1.5, 0.5 and 0.7 fall outside [0.8, 1.28]


def test_dro_by_hand():
    beta = 0.1
    out, grad = run(DROLoss(beta=beta))
    logps = [math.log(r * SAMPLER_P) for r in RATIOS]
    # objective_t = logp_t A_t - beta/2 (log r_t)^2 ; d(-objective)/dlogp = -A_t + beta log r_t
    expected = -sum(lp * a - 0.5 * beta * math.log(r) ** 2 for lp, a, r in zip(logps, ADVANTAGES, RATIOS)) / 4
    assert out.loss.item() == pytest.approx(expected)
    assert grad == pytest.approx([(-a + beta * math.log(r)) / 4 for a, r in zip(ADVANTAGES, RATIOS)])


def test_gspo_by_hand_sequence_ratio_is_geometric_mean_and_padding_is_ignored():
    # Sequence 0: token ratios 1.2, 1.2 -> s = 1.2 > 1.1 ceiling, A = 1: clipped, no gradient.
    # Sequence 1: token ratios 0.81, 1.0 -> s = 0.9 inside [0.8, 1.1], A = 1: loss -0.9 on each of its
    #   2 tokens; ds/dlogp_t = s / 2, so d(-2s)/dlogp_t = -s = -0.9. Its third position is padding
    #   holding a huge logprob. Everything is divided by the denominator 4.
    old_BT = torch.zeros(2, 3)
    logprobs_BT = torch.tensor([[math.log(1.2), math.log(1.2), 0.0], [math.log(0.81), 0.0, 100.0]], requires_grad=True)
    mask_BT = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    advantages_BT = torch.ones(2, 3)
    out = policy_loss(
        GSPOLoss(clip_low=0.2, clip_high=0.1), logprobs_BT, old_BT, advantages_BT, mask_BT, denominator=4.0
    )
    out.loss.backward()
    assert out.loss.item() == pytest.approx((-1.1 * 2 - 0.9 * 2) / 4)
    torch.testing.assert_close(logprobs_BT.grad, torch.tensor([[0.0, 0.0, 0.0], [-0.9 / 4, -0.9 / 4, 0.0]]))
    assert out.num_clipped == 2


# One sequence, token ratios 0.81 and 1.0 (sequence ratio: their geometric mean 0.9), then padding
# that holds a huge logprob; A = 1 everywhere, denominator 2. For the unclipped IS loss
# -sum_t w_t / 2, with w_t the ratio at each level:
#   token:             w = [0.81, 1.0]                        d/dlogp_j = -r_j / 2
#   sequence:          w = [0.9, 0.9]                         d/dlogp_j = -(n * s / n) / 2 = -0.9 / 2
#   average:           w = [(0.81+0.9)/2, (1+0.9)/2]          d/dlogp_j = -(r_j/2 + s/2) / 2
#   geometric_average: w = [sqrt(0.81*0.9), sqrt(0.9)]        d/dlogp_j = -(w_j/2 + sum(w)/4) / 2
LEVEL_CASES = {
    "token": ([0.81, 1.0], [-0.81 / 2, -1.0 / 2]),
    "sequence": ([0.9, 0.9], [-0.9 / 2, -0.9 / 2]),
    "average": ([0.855, 0.95], [-0.855 / 2, -0.95 / 2]),
    "geometric_average": (
        [math.sqrt(0.729), math.sqrt(0.9)],
        [-(math.sqrt(0.729) / 2 + (math.sqrt(0.729) + math.sqrt(0.9)) / 4) / 2,
         -(math.sqrt(0.9) / 2 + (math.sqrt(0.729) + math.sqrt(0.9)) / 4) / 2],
    ),
}  # fmt: skip


@pytest.mark.parametrize("level", list(LEVEL_CASES))
def test_each_importance_sampling_level_by_hand(level):
    weights, grads = LEVEL_CASES[level]
    old_BT = torch.zeros(1, 3, dtype=torch.float64)
    logprobs_BT = torch.tensor([[math.log(0.81), 0.0, 100.0]], dtype=torch.float64, requires_grad=True)
    mask_BT = torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64)
    advantages_BT = torch.ones(1, 3, dtype=torch.float64)
    loss_cfg = ImportanceSamplingLoss(importance_sampling_level=level)
    out = policy_loss(loss_cfg, logprobs_BT, old_BT, advantages_BT, mask_BT, denominator=2.0)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(-sum(weights) / 2)
    assert logprobs_BT.grad[0].tolist() == pytest.approx([*grads, 0.0])


def test_cispo_and_ppo_clip_the_ratio_of_their_level():
    # Sequence ratio 0.9 for both tokens: CISPO with ART's clips (floor 0, ceiling 5) weighs each
    # token's log-probability gradient by 0.9; PPO with ceiling 1 - 0.05 = 0.95 for A = -1 clips the
    # sequence (min(-0.9, -0.95) = -0.95) and so gives no gradient, where token level would not clip 1.0.
    old_BT = torch.zeros(1, 2, dtype=torch.float64)
    mask_BT = torch.ones(1, 2, dtype=torch.float64)
    logprobs_BT = torch.tensor([[math.log(0.81), 0.0]], dtype=torch.float64, requires_grad=True)
    cispo = CISPOLoss(clip_low=1.0, clip_high=4.0, importance_sampling_level="sequence")
    policy_loss(
        cispo, logprobs_BT, old_BT, torch.ones(1, 2, dtype=torch.float64), mask_BT, denominator=2.0
    ).loss.backward()
    assert logprobs_BT.grad[0].tolist() == pytest.approx([-0.9 / 2, -0.9 / 2])
    logprobs_BT.grad = None
    ppo = PPOLoss(clip_low=0.05, clip_high=0.28, importance_sampling_level="sequence")
    out = policy_loss(ppo, logprobs_BT, old_BT, -torch.ones(1, 2, dtype=torch.float64), mask_BT, denominator=2.0)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(0.95) and out.num_clipped == 2
    assert logprobs_BT.grad[0].tolist() == pytest.approx([0.0, 0.0])


def test_kl_estimators_by_hand():
    logprobs_BT = torch.tensor([[math.log(0.5)]])
    ref_BT = torch.tensor([[math.log(0.25)]])
    # log(p_ref / p) = log(0.5) = -0.693147
    assert KL_ESTIMATORS["k1"](logprobs_BT, ref_BT).item() == pytest.approx(math.log(2))
    assert KL_ESTIMATORS["k2"](logprobs_BT, ref_BT).item() == pytest.approx(0.5 * math.log(2) ** 2)
    assert KL_ESTIMATORS["k3"](logprobs_BT, ref_BT).item() == pytest.approx(0.5 - 1 + math.log(2))


def test_kl_penalty_is_added_to_the_loss():
    logprobs_BT, old_BT, advantages_BT, mask_BT = reference_case()
    ref_BT = old_BT.clone()  # reference = sampler here, so KL_t is k3 of log(1/r_t)
    out = policy_loss(
        ImportanceSamplingLoss(),
        logprobs_BT,
        old_BT,
        advantages_BT,
        mask_BT,
        denominator=4.0,
        ref_logprobs_BT=ref_BT,
        kl_coef=0.5,
        kl_estimator="k3",
    )
    k3 = [1 / r - 1 + math.log(r) for r in RATIOS]
    assert float(out.kl_sum) == pytest.approx(sum(k3))
    assert out.loss.item() == pytest.approx(((-1.5 - 0.5 + 1.1 + 0.7) + 0.5 * sum(k3)) / 4)


@pytest.mark.parametrize("source", ["current_learner", "sample"])
def test_arts_kl_penalty_shapes_the_advantages_by_hand(source):
    """ART's `kl_penalty_coef`: A_t + coef * (mean kl - kl_t), kl_t = source_t - base_t, all detached."""
    logprobs_BT, old_BT, advantages_BT, mask_BT = reference_case()
    kl = [0.4, 0.0, -0.2, 0.2]  # mean 0.1
    source_BT = logprobs_BT.detach() if source == "current_learner" else old_BT
    ref_BT = source_BT - torch.tensor([kl], dtype=torch.float64)
    out = policy_loss(ImportanceSamplingLoss(), logprobs_BT, old_BT, advantages_BT, mask_BT, denominator=4.0,
                      ref_logprobs_BT=ref_BT, kl_advantage=KLAdvantage(coef=0.5, source=source))  # fmt: skip
    out.loss.backward()
    shaped = [0.85, 1.05, -0.85, -1.05]  # 1 + 0.5 * (0.1 - 0.4), 1 + 0.5 * 0.1, -1 + 0.5 * 0.3, -1 + 0.5 * (0.1 - 0.2)
    assert out.loss.item() == pytest.approx(-sum(r * a for r, a in zip(RATIOS, shaped)) / 4)
    assert logprobs_BT.grad[0].tolist() == pytest.approx([-r * a / 4 for r, a in zip(RATIOS, shaped)])  # no KL gradient
    assert float(out.kl_to_base_sum) == pytest.approx(sum(kl)) and float(out.kl_sum) == 0.0  # no loss term


def test_arts_kimi_k2_tau_by_hand():
    """ART's `kimi_k2_tau`: A_t - tau * (log p_t - log p_old_t), detached."""
    shaped = [a - 0.1 * math.log(r) for r, a in zip(RATIOS, ADVANTAGES)]
    out, grad = run(ImportanceSamplingLoss(), kl_advantage=KLAdvantage(tau=0.1))
    assert out.loss.item() == pytest.approx(-sum(r * a for r, a in zip(RATIOS, shaped)) / 4)
    assert grad == pytest.approx([-r * a / 4 for r, a in zip(RATIOS, shaped)])


def test_arts_ratio_cap_and_out_of_range_mask_by_hand():
    """ART's `max_negative_advantage_importance_sampling_weight` caps every ratio before clipping; `mask_prob_ratio`
    zeroes a ratio outside (1 - clip_low, 1 + clip_high), which then carries no gradient."""
    out, grad = run(CISPOLoss(ratio_cap=1.2))  # ratios [1.5, 0.5, 1.1, 0.7] -> weights [1.2, 0.5, 1.1, 0.7]
    weights = [1.2, 0.5, 1.1, 0.7]
    logps = [math.log(r * SAMPLER_P) for r in RATIOS]
    assert out.loss.item() == pytest.approx(-sum(w * a * lp for w, a, lp in zip(weights, ADVANTAGES, logps)) / 4)
    assert grad == pytest.approx([-w * a / 4 for w, a in zip(weights, ADVANTAGES)])
    out, grad = run(PPOLoss(clip_low=0.2, clip_high=0.28, mask_out_of_range=True))  # only 1.1 is inside (0.8, 1.28)
    # r = [0, 0, 1.1, 0]: -min(r A, clip(r) A) = [0, 0, 1.1, 0.8] (token 3: min(0, 0.8 * -1) = -0.8)
    assert out.loss.item() == pytest.approx((0 + 0 + 1.1 + 0.8) / 4)
    assert grad == pytest.approx([0.0, 0.0, 1.1 / 4, 0.0])  # the masked tokens carry no gradient


def test_kl_without_reference_is_a_clear_error():
    logprobs_BT, old_BT, advantages_BT, mask_BT = reference_case()
    with pytest.raises(ValueError, match="ref_logprobs_BT"):
        policy_loss(PPOLoss(), logprobs_BT, old_BT, advantages_BT, mask_BT, denominator=1.0, kl_coef=0.1)
    with pytest.raises(ValueError, match="ref_logprobs_BT"):
        policy_loss(PPOLoss(), logprobs_BT, old_BT, advantages_BT, mask_BT, denominator=1.0,
                    kl_advantage=KLAdvantage(coef=0.1))  # fmt: skip


def test_truncated_importance_sampling_by_hand():
    # The trainer's own detached logprobs are the old policy (ratio 1 in value), and each token is
    # weighted by min(p_trainer / p_sampler, 2): weights [1.5, 0.5, 1.1, 0.7] (none above the cap of 2)
    # -> except we pick a cap of 1.2 so token 0 is truncated: [1.2, 0.5, 1.1, 0.7].
    out, grad = run(ImportanceSamplingLoss(), truncated_importance_sampling=1.2)
    weights = [1.2, 0.5, 1.1, 0.7]
    assert out.loss.item() == pytest.approx(-sum(w * a for w, a in zip(weights, ADVANTAGES)) / 4)
    assert grad == pytest.approx([-w * a / 4 for w, a in zip(weights, ADVANTAGES)])


def test_token_mismatch_mask_by_hand():
    # Ratios [1.5, 0.5, 1.1, 0.7] against bounds (0.6, 1.4): token 0 (1.5) and token 1 (0.5) are out.
    # With importance sampling the kept tokens' loss is -(1.1 * -1 + 0.7 * -1) / 4 (the denominator stays 4)
    # and the masked tokens get no gradient.
    out, grad = run(ImportanceSamplingLoss(), token_mask_bounds=(0.6, 1.4))
    assert out.loss.item() == pytest.approx((1.1 + 0.7) / 4)
    assert grad == pytest.approx([0.0, 0.0, 1.1 / 4, 0.7 / 4])
    assert out.num_token_masked.item() == 2 and out.num_sequence_masked.item() == 0
    out, _ = run(ImportanceSamplingLoss(), token_mask_bounds=(0.5, 1.5))  # the bounds themselves are kept
    assert out.num_token_masked.item() == 0


def test_sequence_mismatch_mask_by_hand_uses_the_geometric_mean_and_ignores_padding():
    # Sequence 0: ratios [2, 0.5] -> geometric mean 1: kept by (0.9, 1.1) though each token is far off.
    # Sequence 1: ratios [1.2, 1.2] -> 1.2: masked whole. A padding position with ratio 100 counts for nothing.
    trainer_p = [[1.0, 0.25, 0.5], [0.6, 0.6, 1.0]]
    sampler_p = [[0.5, 0.5, 0.005], [0.5, 0.5, 0.01]]
    logprobs_BT = torch.tensor(trainer_p, dtype=torch.float64).log().requires_grad_()
    sampler_BT = torch.tensor(sampler_p, dtype=torch.float64).log()
    mask_BT = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
    masks = mismatch_masks(logprobs_BT.detach(), sampler_BT, mask_BT, token_bounds=None, sequence_bounds=(0.9, 1.1))
    assert masks.sequence_masked_BT.tolist() == [[False, False, False], [True, True, False]]
    assert masks.token_masked_BT.sum().item() == 0
    both = mismatch_masks(
        logprobs_BT.detach(), sampler_BT, mask_BT, token_bounds=(0.6, 1.4), sequence_bounds=(0.9, 1.1)
    )
    assert both.token_masked_BT.tolist() == [[True, True, False], [False, False, False]]
    assert both.keep_BT.tolist() == [[False, False, True], [False, False, True]]  # padding is kept: its mask is 0
    advantages_BT = torch.ones(2, 3, dtype=torch.float64)
    out = policy_loss(
        ImportanceSamplingLoss(),
        logprobs_BT,
        sampler_BT,
        advantages_BT,
        mask_BT,
        denominator=4.0,
        sequence_mask_bounds=(0.9, 1.1),
    )
    out.loss.backward()
    assert out.loss.item() == pytest.approx(-(2.0 + 0.5) / 4)  # sequence 0's tokens only
    assert logprobs_BT.grad[1].tolist() == [0.0, 0.0, 0.0] and out.num_sequence_masked.item() == 2


def test_mismatch_mask_bounds_must_straddle_one():
    from pydantic import ValidationError

    from agentrl.foundation.config import TrainConfig

    assert TrainConfig(mismatch_token_mask=(0.5, 2.0)).mismatch_token_mask == (0.5, 2.0)
    for bad in [(2.0, 0.5), (0.0, 2.0), (1.0, 2.0), (0.5, 1.0)]:
        with pytest.raises(ValidationError, match=r"0 < low < 1 < high.*e\.g\. \(0\.5, 2\.0\)"):
            TrainConfig(mismatch_sequence_mask=bad)


def test_normalisation_tokens_versus_all_tokens_versus_constant():
    assert loss_denominator("tokens", num_tokens=37, num_sequences=4, constant=1024) == 37
    assert loss_denominator("tokens", num_tokens=37, num_sequences=4, constant=1, num_zero_variance_tokens=13) == 37
    assert loss_denominator("all_tokens", num_tokens=37, num_sequences=4, constant=1, num_zero_variance_tokens=13) == 50
    assert loss_denominator("constant", num_tokens=37, num_sequences=4, constant=10) == 40
    assert loss_denominator("tokens", num_tokens=0, num_sequences=0, constant=10) == 1  # never divides by 0
    out, grad = run(ImportanceSamplingLoss(), denominator=40.0)
    assert out.loss.item() == pytest.approx((-1.5 - 0.5 + 1.1 + 0.7) / 40)


def test_masked_tokens_carry_no_loss_or_gradient():
    logprobs_BT, old_BT, advantages_BT, _ = reference_case()
    mask_BT = torch.tensor([[1.0, 0.0, 1.0, 0.0]])
    out = policy_loss(PPOLoss(), logprobs_BT, old_BT, advantages_BT, mask_BT, denominator=2.0)
    out.loss.backward()
    assert logprobs_BT.grad[0, 1].item() == 0 and logprobs_BT.grad[0, 3].item() == 0


ALL_LOSSES = [ImportanceSamplingLoss(), PPOLoss(), CISPOLoss(), DROLoss(), GSPOLoss()]
logprob_lists = st.lists(st.floats(min_value=-8, max_value=-0.01), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(logps=logprob_lists, shift=st.floats(min_value=-0.5, max_value=0.5), loss_index=st.integers(0, 4))
def test_zero_advantage_gives_zero_gradient(logps, shift, loss_index):
    loss_cfg = ALL_LOSSES[loss_index]
    logprobs_BT = torch.tensor([logps], requires_grad=True)
    # DRO's drift penalty has a gradient of its own unless trainer == sampler, so it is checked there.
    old_BT = logprobs_BT.detach() + (0.0 if loss_cfg.name == "dro" else shift)
    zeros_BT = torch.zeros_like(old_BT)
    out = policy_loss(loss_cfg, logprobs_BT, old_BT, zeros_BT, torch.ones_like(old_BT), denominator=len(logps))
    out.loss.backward()
    assert torch.all(logprobs_BT.grad == 0)


@settings(max_examples=60, deadline=None)
@given(logps=logprob_lists, advantage=st.floats(min_value=-3, max_value=3))
def test_at_ratio_one_ppo_cispo_and_is_agree_in_gradient(logps, advantage):
    grads = []
    for loss_cfg in (ImportanceSamplingLoss(), PPOLoss(), CISPOLoss()):
        logprobs_BT = torch.tensor([logps], requires_grad=True)
        advantages_BT = torch.full_like(logprobs_BT, advantage)
        out = policy_loss(
            loss_cfg, logprobs_BT, logprobs_BT.detach(), advantages_BT, torch.ones_like(advantages_BT), denominator=3.0
        )
        out.loss.backward()
        grads.append(logprobs_BT.grad.clone())
    torch.testing.assert_close(grads[0], grads[1])
    torch.testing.assert_close(grads[0], grads[2])


def test_every_loss_config_names_a_registered_loss_and_a_name_selects_it():
    import agentrl
    from agentrl.foundation.config import LOSS_CONFIGS
    from agentrl.rl.losses import token_loss

    assert set(LOSS_CONFIGS) == {"importance_sampling", "ppo", "cispo", "dro", "gspo"}
    for name, config_type in LOSS_CONFIGS.items():
        assert token_loss.dispatch(config_type) is not token_loss.dispatch(object), name  # a loss, not the fallback
        assert type(agentrl.TrainConfig(loss=name).loss) is config_type
    with pytest.raises(TypeError, match="no policy loss is registered for str"):
        token_loss("ppo", *[torch.zeros(1, 2)] * 4)
