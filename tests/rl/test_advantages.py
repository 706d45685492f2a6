"""rl/advantages.py against hand-computed values."""

import math

import pytest

from agentrl.rl.advantages import compute_group_advantages, group_advantages


def test_centred_and_std_scaled_by_hand():
    # rewards [1, 0, 0, 1]: mean 0.5, population std 0.5
    assert group_advantages([1, 0, 0, 1], scale_by_std=False) == [0.5, -0.5, -0.5, 0.5]
    assert group_advantages([1, 0, 0, 1], scale_by_std=True) == pytest.approx([1, -1, -1, 1], abs=1e-5)
    # rewards [3, 1, 2]: mean 2, std sqrt(2/3)
    std = math.sqrt(2 / 3)
    assert group_advantages([3, 1, 2], scale_by_std=True) == pytest.approx([1 / std, -1 / std, 0], abs=1e-5)


def test_zero_variance_groups_are_dropped_and_counted():
    result = compute_group_advantages([[1, 1, 1], [0, 1], [0.5], [2, 2]], scale_by_std=False)
    assert result.kept_group_indices == [1]
    assert result.num_dropped_groups == 3
    assert result.advantages_P_G == [[-0.5, 0.5]]


def test_advantages_sum_to_zero_within_a_group():
    result = compute_group_advantages([[0.1, 0.7, 0.3, 0.9]], scale_by_std=True)
    assert sum(result.advantages_P_G[0]) == pytest.approx(0, abs=1e-9)


def test_arts_advantage_balance_by_hand():
    from agentrl.rl.advantages import balanced

    assert balanced([1.0, -1.0, 0.5, -0.5], 0.25) == [1.0, -0.75, 0.5, -0.375]  # negatives times 1 - 0.25
    assert balanced([1.0, -1.0, 0.5, -0.5], -0.5) == [0.5, -1.0, 0.25, -0.5]  # positives times 1 - 0.5
    assert balanced([1.0, -1.0], 0.0) == [1.0, -1.0]
    result = compute_group_advantages([[1, 0, 0, 1]], scale_by_std=False, balance=0.5)
    assert result.advantages_P_G == [[0.5, -0.25, -0.25, 0.5]]


def test_arts_mean_abs_scaling_by_hand():
    """ART's packing divides the step's token advantages by their mean |advantage| over the loss tokens."""
    from agentrl.rl.advantages import scaled_by_mean_abs
    from agentrl.rl.tokenize import TokenizedSequence

    def sequence(loss_tokens: int, advantage: float) -> TokenizedSequence:
        mask = [False, *([True] * loss_tokens)]  # the first position never carries a loss
        return TokenizedSequence(list(range(len(mask))), mask, [0.0] * len(mask), advantage, 0)

    sequences = [sequence(3, 1.0), sequence(1, -2.0)]  # mean |A| over 4 tokens: (3 * 1 + 1 * 2) / 4 = 1.25
    scaled = scaled_by_mean_abs(sequences, enabled=True)
    assert [s.advantage for s in scaled] == pytest.approx([1 / 1.25, -2 / 1.25])
    assert scaled_by_mean_abs(sequences, enabled=False) is sequences
    zero = [sequence(2, 0.0)]
    assert scaled_by_mean_abs(zero, enabled=True) == zero
