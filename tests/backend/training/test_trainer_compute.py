"""The trainer's fast paths compute what the plain ones do: the fused LoRA forward against peft's,
chunked logprobs against full log-softmax, matmul attention against SDPA, and a right-padded batch
without an attention mask against each sequence alone. Real packaged model, no server."""

from __future__ import annotations

import math

import pytest
import torch

import agentrl
from agentrl.backend.training.step.attention import SHORT_SEQUENCE
from agentrl.backend.training.step.logprobs import SelectedLogprobs, token_logprobs
from agentrl.rl.micro_batches import collate
from agentrl.rl.tokenize import TokenizedSequence


@pytest.fixture(scope="module")
def trainer(base_model_path):
    from agentrl.backend.training.trainer import Trainer

    trainer = Trainer(base_model_path, seed=0)
    trainer.add_adapter("default", agentrl.LoRAConfig())
    torch.manual_seed(1)
    with torch.no_grad():  # a trained-looking adapter: B is zero when fresh, which would hide the LoRA path
        for parameter in trainer.adapters["default"].parameters:
            parameter.normal_(0.0, 0.05)
    return trainer


def sequence(length: int, seed: int) -> TokenizedSequence:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(100, 40_000, (length,), generator=generator).tolist()
    loss = [i >= length // 3 for i in range(length)]
    return TokenizedSequence(ids, loss, [-1.0 if m else 0.0 for m in loss], 1.0, 0)


def lora_layers(model):
    from peft.tuners.lora.layer import Linear

    return [m for m in model.modules() if isinstance(m, Linear)]


def test_fused_lora_forward_matches_peft_outputs_and_gradients(trainer):
    layer = lora_layers(trainer.model)[0]
    assert hasattr(layer, "_peft_forward"), "the trainer did not fuse its LoRA layers"
    x = torch.randn(3, 17, layer.in_features, dtype=layer.base_layer.weight.dtype)  # bf16, or float32 (precision)
    results = []
    for forward in (layer.forward, layer._peft_forward):
        layer.zero_grad(set_to_none=True)
        with trainer._autocast():
            y = forward(x)
        (y.float() * torch.linspace(-1, 1, y.shape[-1])).sum().backward()
        a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
        results.append((y.float(), a.grad.clone(), b.grad.clone()))
    (fused_y, fused_ga, fused_gb), (peft_y, peft_ga, peft_gb) = results
    assert fused_ga.dtype == torch.float32  # fp32 masters get fp32 gradients
    scale = peft_y.abs().max()
    assert (fused_y - peft_y).abs().max() <= 0.02 * scale  # bf16 rounding of differently ordered sums
    for fused, plain in ((fused_ga, peft_ga), (fused_gb, peft_gb)):
        assert torch.linalg.norm(fused - plain) <= 0.02 * torch.linalg.norm(plain)
    with trainer.model.disable_adapter():  # the reference pass: base layer only
        assert torch.equal(layer(x), layer.base_layer(x))


def test_chunked_logprobs_match_full_log_softmax_and_its_gradient():
    torch.manual_seed(0)
    hidden_NH = torch.randn(150, 32, requires_grad=True)  # 150 positions: two chunks or more on a CPU
    head_VH = torch.randn(1000, 32) * 0.3
    targets_N = torch.randint(0, 1000, (150,))
    weights_N = torch.randn(150)

    logprobs_N, entropy_N = SelectedLogprobs.apply(hidden_NH, head_VH, targets_N)
    (logprobs_N * weights_N).sum().backward()
    grad_chunked = hidden_NH.grad.clone()

    hidden_NH.grad = None
    full_NV = torch.log_softmax(hidden_NH @ head_VH.t(), dim=-1)
    expected_N = full_NV.gather(1, targets_N[:, None]).squeeze(1)
    (expected_N * weights_N).sum().backward()
    assert torch.allclose(logprobs_N, expected_N.detach(), atol=1e-5)
    assert torch.allclose(entropy_N, -(full_NV.exp() * full_NV).sum(-1).detach(), atol=1e-4)
    assert torch.allclose(grad_chunked, hidden_NH.grad, atol=1e-5)
    assert not entropy_N.requires_grad


@pytest.mark.parametrize("length", [40, SHORT_SEQUENCE + 12], ids=["matmul-attention", "sdpa"])
def test_padded_batch_without_mask_keeps_pads_out_and_matches_sdpa(trainer, length):
    """Right padding with causal attention only, on the short-sequence path and the SDPA path: what
    the pads hold changes no real token's logprob (bit for bit), each sequence scores as it does
    alone and as transformers' SDPA scores it (up to bf16 rounding of other batch shapes)."""
    sequences = [sequence(length, 1), sequence(length // 2, 2), sequence(length - 7, 3)]
    batch = collate(sequences, trainer.pad_token_id)
    other_pads = collate(sequences, trainer.pad_token_id + 7)
    with torch.no_grad(), trainer._autocast():
        together_BT, entropy_N = token_logprobs(trainer.model, batch)
        other_pads_BT, _ = token_logprobs(trainer.model, other_pads)
        alone = [token_logprobs(trainer.model, collate([s], trainer.pad_token_id))[0] for s in sequences]
        base = trainer.model.get_base_model()
        base.set_attn_implementation("sdpa")
        try:
            sdpa_BT, _ = token_logprobs(trainer.model, batch)
        finally:
            base.set_attn_implementation("agentrl_cpu")
    mask_BT = batch.loss_mask_BT[:, 1:].bool()
    assert len(entropy_N) == int(mask_BT.sum())
    assert torch.equal(together_BT, other_pads_BT)

    def mean_relative_gap(a: torch.Tensor, b: torch.Tensor) -> float:
        return float(((a - b).abs() / b.abs()).mean())

    for row, single_1T in enumerate(alone):
        n = single_1T.shape[1]
        real = mask_BT[row, :n]
        assert mean_relative_gap(together_BT[row, :n][real], single_1T[0][real]) < 0.01  # measured up to 0.7%
    assert mean_relative_gap(together_BT[mask_BT], sdpa_BT[mask_BT]) < 0.01


def test_a_training_step_shows_its_micro_batches_and_running_loss(trainer, tokenizer, capsys):
    from tests.helpers import synthetic_groups

    groups = synthetic_groups(tokenizer, seed=3, size=2, max_words=8)
    outcome = trainer.train_step("default", groups, agentrl.TrainConfig(learning_rate=1e-6, micro_batch_tokens=32))
    shown = capsys.readouterr().err
    assert "train step" in shown and "micro-batch" in shown and "loss=" in shown
    assert outcome is not None


def test_the_trainer_creates_every_tensor_on_the_models_device(base_model_path, monkeypatch):
    """No GPU here: the model and batches on `meta` show any tensor made on the CPU by mistake."""
    import torch.fx.experimental._config as fx_config
    import transformers.masking_utils

    from agentrl.backend.training.step.logprobs import token_logprobs
    from agentrl.backend.training.trainer import Trainer
    from agentrl.rl.micro_batches import collate
    from agentrl.rl.tokenize import TokenizedSequence

    trainer = Trainer(base_model_path, device="meta")
    trainer.add_adapter("default", agentrl.LoRAConfig())
    trainer.model.get_base_model().config._attn_implementation = "eager"  # sdpa's mask check reads values
    # and so does the check for packed rows in the position ids (the trainer's rows are never packed)
    monkeypatch.setattr(transformers.masking_utils, "find_packed_sequence_indices", lambda position_ids: None)
    sequences = [
        TokenizedSequence(
            [1, 2, 3, 4, 5, 6], [False, False, False, True, True, True], [0, 0, 0, -1.0, -0.5, -0.2], 1.0, 0
        ),
        TokenizedSequence([1, 2, 3, 4], [False, False, True, True], [0, 0, -1.0, -0.3], -1.0, 0),
    ]
    previous = fx_config.meta_nonzero_assume_all_nonzero
    fx_config.meta_nonzero_assume_all_nonzero = True  # boolean indexing on meta (data-dependent shape)
    try:
        logprobs_BT, entropy_N = token_logprobs(trainer.model, collate(sequences, trainer.pad_token_id).to("meta"))
        assert logprobs_BT.device.type == entropy_N.device.type == "meta"
        configs = [
            agentrl.TrainConfig(),
            agentrl.TrainConfig(kl_coef=0.1, loss="cispo", truncated_importance_sampling=2.0),
        ]
        for config in configs:
            sums, plan = trainer._accumulate_gradients(sequences, config, 5.0, trainer.micro_batch_tokens)
            assert plan.packed  # the two share a prefix: the packed path's tensors are checked too
            assert {t.device.type for t in sums.values()} == {"meta"}
            assert all(
                p.grad is not None and p.grad.device.type == "meta" for p in trainer.adapters["default"].parameters
            )
    finally:
        fx_config.meta_nonzero_assume_all_nonzero = previous


def test_a_micro_batch_that_runs_out_of_gpu_memory_is_halved_and_the_step_is_the_same(
    tiny_model_path, tokenizer, monkeypatch
):
    """Out of memory in a step's second micro-batch (raised here as a full GPU raises it) drops the
    partial gradients, halves the default micro-batch for good and gives the update a step at the halved
    size gives; with a size the config set it raises, naming the setting, and leaves no gradients."""
    import copy

    from agentrl.backend.training import trainer as trainer_module
    from agentrl.backend.training.step import memory
    from agentrl.foundation.errors import TrainingError
    from tests.helpers import synthetic_groups

    trainer = trainer_module.Trainer(tiny_model_path, seed=0)
    trainer.add_adapter("default", agentrl.LoRAConfig())
    adapter = trainer._activate("default")
    weights = [p.detach().clone() for p in adapter.parameters]
    optimizer_state = copy.deepcopy(adapter.optimizer.state_dict())
    groups = synthetic_groups(tokenizer, seed=5, size=4)  # ~450 tokens: two micro-batches of 256, more of 128
    trainer.micro_batch_tokens = 256
    monkeypatch.setattr(memory, "SMALLEST_MICRO_BATCH", 64)
    calls = []
    real_token_logprobs = trainer_module.token_logprobs

    def full_on_second_micro_batch(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.32 GiB.")
        return real_token_logprobs(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "token_logprobs", full_on_second_micro_batch)
    halved = trainer.train_step("default", groups, agentrl.TrainConfig(learning_rate=1e-3)).metrics
    assert len(calls) > 2 and halved["micro_batch_tokens"] == trainer.micro_batch_tokens == 128
    after_halving = [p.detach().clone() for p in adapter.parameters]

    with torch.no_grad():
        for parameter, weight in zip(adapter.parameters, weights, strict=True):
            parameter.copy_(weight)
    adapter.optimizer.load_state_dict(optimizer_state)
    direct = trainer.train_step("default", groups, agentrl.TrainConfig(learning_rate=1e-3, micro_batch_tokens=128))
    assert direct.metrics["loss"] == pytest.approx(halved["loss"], rel=1e-6)
    for parameter, expected in zip(adapter.parameters, after_halving, strict=True):
        assert torch.allclose(parameter, expected, rtol=1e-5, atol=1e-7)
    assert any(not torch.equal(moved, weight) for moved, weight in zip(after_halving, weights, strict=True))

    calls.clear()
    with pytest.raises(TrainingError, match=r"micro-batch of 256 tokens ran out of memory.*micro_batch_tokens=.*128"):
        trainer.train_step("default", groups, agentrl.TrainConfig(micro_batch_tokens=256))
    assert all(p.grad is None for p in adapter.parameters)


def test_a_step_reports_the_sampler_trainer_gap_and_the_tokens_each_mismatch_mask_left_out(tiny_model_path, tokenizer):
    """Sampler logprobs set to the trainer's own plus planted offsets: the step's mismatch metrics are
    those offsets' mean, largest and share over the threshold, and each mask leaves out the tokens and
    sequences its bounds name (IcePop (0.5, 2.0): |offset| > ln 2; sequences: mean offset beyond ln 1.1)."""
    from agentrl.backend.training.step.grpo_loss import MISMATCH_THRESHOLD
    from agentrl.backend.training.trainer import Trainer
    from agentrl.rl.engine_context import tokenize_groups
    from tests.helpers import make_choice, synthetic_groups

    trainer = Trainer(tiny_model_path, seed=0)
    trainer.add_adapter("default", agentrl.LoRAConfig())
    groups = synthetic_groups(tokenizer, seed=11, size=4, max_words=12)
    sequences = tokenize_groups(groups, [[1.0] * 4] * len(groups), trainer.tokenizer).sequences
    trainer_logprobs = trainer.logprobs_of("default", sequences)  # loss tokens, in the trajectories' order
    token_offsets = [0.0, 1.0, -0.05, -1.0, 0.3]  # sampler minus trainer, cycled over each answer's tokens
    offsets, replanted = [], []
    for group, answers in zip(groups, [trainer_logprobs[i : i + 4] for i in range(0, len(trainer_logprobs), 4)]):
        trajectories = []
        for index, (trajectory, lps) in enumerate(zip(group.trajectories, answers)):
            choice = trajectory.messages_and_choices[1]
            shift = 0.15 if index == 0 else 0.0  # each group's first answer is off as a whole
            planted = [token_offsets[i % len(token_offsets)] + shift for i in range(len(lps))]
            offsets.append(planted)
            sampled = [lp + o for lp, o in zip(lps, planted)]
            trajectories.append(
                trajectory.model_copy(
                    update={
                        "messages_and_choices": [
                            trajectory.messages_and_choices[0],
                            make_choice(choice.token_ids, sampled, content=choice.message.content),
                        ]
                    }
                )
            )
        replanted.append(agentrl.TrajectoryGroup(trajectories))
    flat_offsets = [o for answer in offsets for o in answer]
    n = len(flat_offsets)
    config = agentrl.TrainConfig(
        learning_rate=1e-3, mismatch_token_mask=(0.5, 2.0), mismatch_sequence_mask=(1 / 1.1, 1.1)
    )
    metrics = trainer.train_step("default", replanted, config).metrics
    assert metrics["mismatch_abs_mean"] == pytest.approx(sum(abs(o) for o in flat_offsets) / n, abs=1e-4)
    assert metrics["mismatch_abs_max"] == pytest.approx(max(abs(o) for o in flat_offsets), abs=1e-4)
    assert metrics["mismatch_over_threshold"] == pytest.approx(
        sum(abs(o) > MISMATCH_THRESHOLD for o in flat_offsets) / n
    )
    # The ratio p_trainer / p_sampler is exp(-offset).
    assert metrics["token_mask_fraction"] == pytest.approx(sum(abs(o) > math.log(2) for o in flat_offsets) / n)
    off_sequences = [answer for answer in offsets if abs(sum(answer) / len(answer)) > math.log(1.1)]
    assert 0 < len(off_sequences) < len(offsets)  # the planted offsets put some sequences out, not all
    assert metrics["sequence_mask_fraction"] == pytest.approx(sum(len(a) for a in off_sequences) / n)


def test_all_tokens_normalisation_counts_the_zero_variance_groups_tokens(tiny_model_path, tokenizer):
    """A step of two groups, one with equal rewards (no loss): "all_tokens" divides the same summed loss
    (and gradient) by the trained tokens plus that group's, "tokens" by the trained tokens alone."""
    from agentrl.backend.training.trainer import Trainer
    from tests.helpers import synthetic_groups

    trainer = Trainer(tiny_model_path, seed=0)
    groups = synthetic_groups(tokenizer, seed=5, size=4, num_groups=2, max_words=10)
    for trajectory in groups[1].trajectories:
        trajectory.reward = 0.5
    metrics, solved = {}, set()
    for mode in ("tokens", "all_tokens"):
        trainer.add_adapter(mode, agentrl.LoRAConfig())  # fresh: B is zero, so both start at the base model
        config = agentrl.TrainConfig(loss_normalization=mode, max_grad_norm=0.0)
        outcome = trainer.train_step(mode, groups, config)
        metrics[mode] = outcome.metrics
        solved.add(outcome.counts.tokens_zero_variance)
    (solved,) = solved
    trained = metrics["tokens"]["trained_tokens"]
    assert solved > 0 and metrics["all_tokens"]["trained_tokens"] == trained
    shrink = trained / (trained + solved)
    assert metrics["all_tokens"]["loss"] == pytest.approx(metrics["tokens"]["loss"] * shrink, rel=1e-5)
    assert metrics["all_tokens"]["grad_norm"] == pytest.approx(metrics["tokens"]["grad_norm"] * shrink, rel=1e-4)


def test_arts_kl_penalty_reads_the_base_models_logprobs_and_reports_the_mean_kl(tiny_model_path, tokenizer):
    """A step with ART's `kl_penalty_coef` (agentrl's `kl_advantage_coef`) makes the reference pass: after a first
    step moved the adapter, the second reports the mean KL to the base (`kl_policy_ref`) and adds no loss term."""
    from agentrl.backend.training.trainer import Trainer
    from tests.helpers import synthetic_groups

    trainer = Trainer(tiny_model_path, seed=0)
    trainer.add_adapter("default", agentrl.LoRAConfig())
    groups = synthetic_groups(tokenizer, seed=5, size=4, max_words=8)
    config = agentrl.TrainConfig(learning_rate=5e-3, loss="cispo", kl_advantage_coef=0.5)
    first = trainer.train_step("default", groups, config).metrics
    assert first["kl_policy_ref"] == pytest.approx(0.0, abs=1e-6)  # the adapter starts at zero: policy = base
    second = trainer.train_step("default", groups, config).metrics
    assert abs(second["kl_policy_ref"]) > 1e-5 and second["kl_penalty"] == 0.0
    plain = trainer.train_step("default", groups, agentrl.TrainConfig(learning_rate=5e-3, loss="cispo")).metrics
    assert plain["kl_policy_ref"] == 0.0  # no reference pass asked for


def test_a_checkpoint_as_the_kl_reference_is_measured_against_and_leaves_the_trained_adapter_training(
    tiny_model_path, tokenizer, tmp_path
):
    """ART's `kl_penalty_reference_step` / `kl_ref_adapter_path` (agentrl's `kl_reference`): the reference pass
    runs the given adapter. Measured against a copy of the adapter being trained, the KL is zero; against the base
    it is not; either way the trained adapter still gets its gradients and only it is saved."""
    from agentrl.backend.training.step.kl_reference import REFERENCE_ADAPTER
    from agentrl.backend.training.trainer import Trainer
    from tests.helpers import synthetic_groups

    trainer = Trainer(tiny_model_path, seed=0)
    trainer.add_adapter("default", agentrl.LoRAConfig())
    groups = synthetic_groups(tokenizer, seed=5, size=4, max_words=8)
    trainer.train_step("default", groups, agentrl.TrainConfig(learning_rate=5e-3, loss="cispo"))  # moves the adapter
    (tmp_path / "step1").mkdir()
    trainer.save("default", tmp_path / "step1")
    to_itself = agentrl.TrainConfig(
        learning_rate=5e-3, loss="cispo", kl_coef=0.1, kl_advantage_coef=0.5, kl_reference=str(tmp_path / "step1")
    )
    same = trainer.train_step("default", groups, to_itself).metrics
    assert same["kl_policy_ref"] == pytest.approx(0.0, abs=1e-6) and same["kl_penalty"] == pytest.approx(0.0, abs=1e-6)
    assert same["grad_norm"] > 0
    to_base = trainer.train_step("default", groups, to_itself.model_copy(update={"kl_reference": None})).metrics
    assert abs(to_base["kl_policy_ref"]) > 1e-5
    again = trainer.train_step("default", groups, to_itself).metrics  # the adapter moved on from the step-1 copy
    assert abs(again["kl_policy_ref"]) > 1e-6
    assert trainer.model.active_adapter == "default"
    assert all(p.requires_grad for p in trainer.adapters["default"].parameters)
    (tmp_path / "after").mkdir()
    trainer.save("default", tmp_path / "after")
    assert REFERENCE_ADAPTER not in (tmp_path / "after" / "adapter_config.json").read_text()
    with pytest.raises(agentrl.ConfigurationError, match="holds no peft adapter"):
        trainer.train_step("default", groups, to_itself.model_copy(update={"kl_reference": str(tmp_path / "none")}))


def test_a_step_sets_adams_settings_and_scales_its_learning_rate_by_its_sequence_count(tiny_model_path, tokenizer):
    """ART's `adam_params` and `num_trajectories_learning_rate_multiplier_power` reach the optimizer of the step."""
    from agentrl.backend.training.trainer import Trainer
    from tests.helpers import synthetic_groups

    trainer = Trainer(tiny_model_path, seed=0)
    trainer.add_adapter("default", agentrl.LoRAConfig())
    groups = synthetic_groups(tokenizer, seed=5, size=4, max_words=8)
    config = agentrl.TrainConfig(
        learning_rate=1e-3, learning_rate_sequence_power=0.5, adam_betas=(0.8, 0.95), adam_eps=1e-6, weight_decay=0.01
    )
    metrics = trainer.train_step("default", groups, config).metrics
    assert metrics["learning_rate"] == pytest.approx(1e-3 * metrics["num_sequences"] ** 0.5)
    (settings,) = trainer.adapters["default"].optimizer.param_groups
    assert settings["lr"] == metrics["learning_rate"] and settings["betas"] == (0.8, 0.95)
    assert (settings["eps"], settings["weight_decay"]) == (1e-6, 0.01)
