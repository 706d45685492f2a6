"""agentrl.art trains as ART's LocalBackend does at the optimizer level: three `model.train()` calls of ART's 2048
recipe (`art.TrainConfig(learning_rate=1e-5)`) against a hand computation of what ART's Unsloth trainer does with
them. No server: the trainer on the tiny model, real token ids."""

from __future__ import annotations

import math

import pytest
import torch

import agentrl
from agentrl.art.training import agentrl_train_config, merged_keys
from agentrl.backend.training.step.logprobs import token_logprobs
from agentrl.rl.engine_context import tokenize_groups
from agentrl.rl.micro_batches import collate
from tests.helpers import synthetic_groups

LEARNING_RATE = 1e-5  # ART's 2048 recipe


def fresh_trainer(tiny_model_path):
    from agentrl.backend.training.trainer import Trainer

    trainer = Trainer(tiny_model_path, seed=0)
    trainer.add_adapter("default", agentrl.LoRAConfig())
    torch.manual_seed(1)
    with torch.no_grad():  # a trained-looking adapter: a fresh B of zeros would give A no gradient
        for parameter in trainer.adapters["default"].parameters:
            parameter.normal_(0.0, 2.0)  # large enough that some gradients pass the clip
    return trainer


class HandAdamW:
    """ART's optimizer written out: AdamW with betas (0.9, 0.99), eps 1e-8, decoupled weight decay 0.1, after a
    gradient-norm clip to 0.1 (torch's rule: scale by 0.1 / (norm + 1e-6) when that is below 1)."""

    beta1, beta2, eps, weight_decay, max_norm = 0.9, 0.99, 1e-8, 0.1, 0.1

    def __init__(self, parameters: list[torch.nn.Parameter]) -> None:
        self.parameters = parameters
        self.m = [torch.zeros_like(p) for p in parameters]
        self.v = [torch.zeros_like(p) for p in parameters]
        self.t = 0
        self.norms: list[float] = []

    @torch.no_grad()
    def step(self, lr: float) -> float:
        grads = [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in self.parameters]
        norm = math.sqrt(sum(float(g.double().square().sum()) for g in grads))
        self.norms.append(norm)
        scale = min(1.0, self.max_norm / (norm + 1e-6))
        self.t += 1
        for p, g, m, v in zip(self.parameters, grads, self.m, self.v, strict=True):
            g = g * scale
            p.mul_(1 - lr * self.weight_decay)
            m.mul_(self.beta1).add_((1 - self.beta1) * g)
            v.mul_(self.beta2).add_((1 - self.beta2) * g * g)
            m_hat = m / (1 - self.beta1**self.t)
            v_hat = v / (1 - self.beta2**self.t)
            p.sub_(lr * m_hat / (v_hat.sqrt() + self.eps))
            p.grad = None
        return norm


def hand_train_call(trainer, optimizer: HandAdamW, groups, tokenizer) -> int:
    """One ART `train()` by hand: GRPO advantages per group (population std + 1e-6), divided by their mean |A| over
    trajectories; then one optimizer step per trajectory, its CISPO loss (ratio to the sampler's logprob, clipped to
    [0, 5] and detached, times A times the logprob) summed over its tokens, divided by its tokens (the row's mean) and
    weighted by 1/its tokens normalised to a token mean of 1. Returns the optimizer steps taken."""
    advantages_P_G, kept = [], []
    for group in groups:
        rewards = group.rewards
        mean = sum(rewards) / len(rewards)
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
        if max(rewards) - min(rewards) > 1e-9:
            advantages_P_G.append([(r - mean) / (std + 1e-6) for r in rewards])
            kept.append(group)
    flat = [a for advantages in advantages_P_G for a in advantages]
    mean_abs = sum(abs(a) for a in flat) / len(flat)
    advantages_P_G = [[a / mean_abs for a in advantages] for advantages in advantages_P_G]
    sequences = tokenize_groups(kept, advantages_P_G, tokenizer).sequences
    tokens_S = [sum(s.loss_mask_T[1:]) for s in sequences]
    mean_tokens = sum(tokens_S) / len(tokens_S)
    trainer.model.train()
    for sequence, tokens in zip(sequences, tokens_S, strict=True):
        batch = collate([sequence], trainer.pad_token_id).to(trainer.device)
        with trainer._autocast():
            logprobs_BT, _ = token_logprobs(trainer.model, batch)
        mask_BT = batch.loss_mask_BT[:, 1:].float()
        logprobs_BT = logprobs_BT.float()
        ratio_BT = torch.where(mask_BT.bool(), logprobs_BT - batch.sampler_logprobs_BT[:, 1:], 0.0).exp()
        weight = (1 / tokens) / (1 / mean_tokens)
        loss = -(ratio_BT.clamp(0.0, 5.0).detach() * sequence.advantage * logprobs_BT * mask_BT).sum()
        (loss * weight / tokens).backward()
        optimizer.step(LEARNING_RATE)
    return len(sequences)


def flat_parameters(trainer) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).float() for p in trainer.adapters["default"].parameters])


def test_three_train_calls_of_the_2048_recipe_match_arts_optimizer_by_hand(tiny_model_path, tokenizer):
    config = agentrl_train_config(merged_keys(agentrl.art.TrainConfig(learning_rate=LEARNING_RATE), None))
    trained, by_hand = fresh_trainer(tiny_model_path), fresh_trainer(tiny_model_path)
    start = flat_parameters(trained)
    assert torch.equal(start, flat_parameters(by_hand))
    optimizer = HandAdamW(by_hand.adapters["default"].parameters)
    steps = 0
    for call in range(3):
        groups = synthetic_groups(tokenizer, seed=40 + call, size=3, max_words=10)
        metrics = trained.train_step("default", groups, config).metrics
        taken = hand_train_call(by_hand, optimizer, groups, tokenizer)
        assert metrics["optimizer_steps"] == taken == metrics["num_sequences"]  # a step per trajectory, as ART
        steps += taken
    (settings,) = trained.adapters["default"].optimizer.param_groups
    assert (settings["betas"], settings["weight_decay"], settings["lr"]) == ((0.9, 0.99), 0.1, LEARNING_RATE)
    adam_steps = {int(s["step"]) for s in trained.adapters["default"].optimizer.state.values()}
    assert adam_steps == {steps} == {optimizer.t}
    assert max(optimizer.norms) > HandAdamW.max_norm > min(optimizer.norms)  # the clip to 0.1 took part, not always

    update_real = flat_parameters(trained) - start
    update_hand = flat_parameters(by_hand) - start
    error = float(torch.linalg.norm(update_real - update_hand) / torch.linalg.norm(update_hand))
    assert error < 1e-4, f"the update differs from ART's by hand by {error:.2%}"

    # The same three calls trained as agentrl's own default (one AdamW step a call, (0.9, 0.999), no decay, clip
    # 1.0) land elsewhere: the comparison above can tell the two apart.
    other = fresh_trainer(tiny_model_path)
    own = config.model_copy(
        update={"optimizer_step_per": "step", "adam_betas": (0.9, 0.999), "weight_decay": 0.0, "max_grad_norm": 1.0}
    )
    for call in range(3):
        other.train_step("default", synthetic_groups(tokenizer, seed=40 + call, size=3, max_words=10), own)
    update_other = flat_parameters(other) - start
    apart = float(torch.linalg.norm(update_other - update_hand) / torch.linalg.norm(update_hand))
    assert apart > 10 * error and apart > 0.1


@pytest.mark.parametrize("loss_normalization", ["tokens", "constant"])
def test_per_sequence_denominators_weigh_each_conversation_by_one_over_its_length(loss_normalization):
    from agentrl.rl.sequence_weights import per_sequence_denominators
    from agentrl.rl.tokenize import TokenizedSequence

    def sequence(tokens: int, history: int | None) -> TokenizedSequence:
        mask = [False] + [True] * tokens
        return TokenizedSequence([1] * (tokens + 1), mask, [0.0] * (tokens + 1), 1.0, 0, history)

    # conversation 0 took two sequences (4 + 6 tokens), then single ones of 5 and 15 tokens: 10 per conversation
    sequences = [sequence(4, 0), sequence(6, 0), sequence(5, None), sequence(15, None)]
    config = agentrl.TrainConfig(loss_normalization=loss_normalization, normalization_constant=64)
    got = per_sequence_denominators(sequences, config)
    if loss_normalization == "constant":
        assert got == [64.0] * 4
    else:
        assert got == pytest.approx([4 * 10 / 10, 6 * 10 / 10, 5 * 5 / 10, 15 * 15 / 10])
