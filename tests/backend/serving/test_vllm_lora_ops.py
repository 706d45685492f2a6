"""The grouped CPU LoRA ops (agentrl_vllm.lora_ops) give what vLLM's own torch ops give, for one
adapter, several, and each op's output handling, except that "no adapter" (index -1) adds nothing
where vLLM's CPU ops add the last slot's LoRA; the whole-layer method matches vLLM's wrapper; the
plugin is off unless its environment variable is set, and swaps the ops in when it is."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm")

from vllm.lora.ops.torch_ops import lora_ops as vllm_ops  # noqa: E402
from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU  # noqa: E402

import agentrl_vllm.lora_ops as grouped  # noqa: E402

VLLM_SHRINK, VLLM_EXPAND, VLLM_EXPAND_SLICE = vllm_ops.bgmv_shrink, vllm_ops.bgmv_expand, vllm_ops.bgmv_expand_slice
VLLM_SEQUENCE_OPS = {name: getattr(vllm_ops, name) for name in ("sgmv_shrink", "sgmv_expand", "sgmv_expand_slice")}
VLLM_ADD_LORA_LINEAR = PunicaWrapperCPU.add_lora_linear


def with_zero_slot(stacked: torch.Tensor) -> torch.Tensor:
    """vLLM's stacked LoRA weights plus an all-zero last slot, where vLLM's CPU ops send index -1: the
    reference for "no adapter"."""
    return torch.cat([stacked, torch.zeros_like(stacked[:1])])


def test_the_reference_is_vllms_own_code():
    for op in (VLLM_SHRINK, VLLM_EXPAND, VLLM_EXPAND_SLICE, *VLLM_SEQUENCE_OPS.values()):
        assert op.__module__ == "vllm.lora.ops.torch_ops.lora_ops"


@pytest.mark.parametrize(
    "indices", [[0] * 7, [1, 1, 1, 1, 1, 1, 1], [0, 1, -1, 0, 2, 2, 1]], ids=["one", "other", "mixed"]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_ops_match_vllms(indices, dtype):
    torch.manual_seed(0)
    indices_N = torch.tensor(indices)
    x_NI = torch.randn(len(indices), 48, dtype=dtype)
    a = torch.randn(3, 1, 8, 48, dtype=dtype)  # (adapters, 1, rank, in) as vLLM stacks them
    b = torch.randn(3, 1, 40, 8, dtype=dtype)
    tolerance = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 5e-2}

    expected, got = torch.zeros(len(indices), 8), torch.zeros(len(indices), 8)
    VLLM_SHRINK(x_NI, with_zero_slot(a), expected, indices_N, 0.5)
    grouped.bgmv_shrink(x_NI, a, got, indices_N, 0.5)
    torch.testing.assert_close(got, expected, **tolerance)

    base = torch.randn(len(indices), 40, dtype=dtype)
    for add_inputs in (True, False):
        expected_out, got_out = base.clone(), base.clone()
        VLLM_EXPAND(expected, with_zero_slot(b), expected_out, indices_N, add_inputs)
        grouped.bgmv_expand(expected, b, got_out, indices_N, add_inputs)
        torch.testing.assert_close(got_out, expected_out, **tolerance)

        wide = torch.randn(len(indices), 100, dtype=dtype)
        expected_wide, got_wide = wide.clone(), wide.clone()
        VLLM_EXPAND_SLICE(expected, with_zero_slot(b), expected_wide, indices_N, 30, 40, add_inputs)
        grouped.bgmv_expand_slice(expected, b, got_wide, indices_N, 30, 40, add_inputs)
        torch.testing.assert_close(got_wide, expected_wide, **tolerance)


@pytest.mark.parametrize("sequence_indices", [[1, 1, 1], [0, 2, 1], [-1, 1, 1]], ids=["shared", "mixed", "no-lora"])
def test_sequence_ops_match_vllms(sequence_indices):
    """The sgmv ops vLLM's CPU wrapper calls for each batch: each sequence's index covers its tokens."""
    torch.manual_seed(2)
    lengths_S, lora_S = torch.tensor([3, 1, 4]), torch.tensor(sequence_indices)
    metadata = (torch.tensor([0, 3, 4]), lengths_S, lora_S, 3, 4, 8)  # starts, lengths, indices, batches, max, tokens
    x_NI, a, b = torch.randn(8, 48, dtype=torch.bfloat16), torch.randn(3, 1, 8, 48), torch.randn(3, 1, 40, 8)
    a, b = a.to(torch.bfloat16), b.to(torch.bfloat16)
    tolerance = {"rtol": 2e-2, "atol": 5e-2}
    expected, got = torch.zeros(8, 8), torch.zeros(8, 8)
    VLLM_SEQUENCE_OPS["sgmv_shrink"](x_NI, with_zero_slot(a), expected, *metadata, 0.5)
    grouped.sgmv_shrink(x_NI, a, got, *metadata, 0.5)
    torch.testing.assert_close(got, expected, **tolerance)
    base = torch.randn(8, 100, dtype=torch.bfloat16)
    for add_inputs in (True, False):
        expected_out, got_out = base[:, :40].clone(), base[:, :40].clone()
        VLLM_SEQUENCE_OPS["sgmv_expand"](expected, with_zero_slot(b), expected_out, *metadata, add_inputs)
        grouped.sgmv_expand(expected, b, got_out, *metadata, add_inputs)
        torch.testing.assert_close(got_out, expected_out, **tolerance)
        expected_wide, got_wide = base.clone(), base.clone()
        VLLM_SEQUENCE_OPS["sgmv_expand_slice"](
            expected, with_zero_slot(b), expected_wide, *metadata, 30, 40, add_inputs
        )
        grouped.sgmv_expand_slice(expected, b, got_wide, *metadata, 30, 40, add_inputs)
        torch.testing.assert_close(got_wide, expected_wide, **tolerance)
    indices = grouped.token_indices(lora_S, lengths_S)  # one shared index stays one number: no per-token copy
    if len(set(sequence_indices)) == 1:
        assert indices == sequence_indices[0]
    else:
        assert isinstance(indices, torch.Tensor) and indices.tolist() == lora_S.repeat_interleave(lengths_S).tolist()


def test_no_adapter_adds_nothing_where_vllms_cpu_op_adds_the_last_slot():
    torch.manual_seed(3)
    indices_N = torch.tensor([0, -1])
    x_NI, a = torch.randn(2, 48), torch.randn(2, 1, 8, 48)
    vllms, ours = torch.zeros(2, 8), torch.zeros(2, 8)
    VLLM_SHRINK(x_NI, a, vllms, indices_N, 1.0)
    grouped.bgmv_shrink(x_NI, a, ours, indices_N, 1.0)
    torch.testing.assert_close(vllms[1], x_NI[1] @ a[1, 0].t())  # the base-model row got adapter 1
    assert ours[1].abs().max() == 0
    torch.testing.assert_close(ours[0], vllms[0])


def wrapper_for(token_adapters: list[int]) -> PunicaWrapperCPU:
    """vLLM's CPU punica wrapper with a batch's metadata set as vLLM sets it (one entry per token)."""
    wrapper = PunicaWrapperCPU(max_num_batched_tokens=512, max_batches=64, device="cpu")
    wrapper._token_lora_indices[: len(token_adapters)] = torch.tensor(token_adapters)
    wrapper.indices_len = [len(token_adapters)] * 4
    wrapper._update_prefill_metadata(wrapper.token_lora_indices)
    wrapper.is_prefill = True
    return wrapper


@pytest.mark.parametrize(
    "token_adapters",
    [[1] * 7, [1] * 300, [0, 0, 1, 1, 1, -1, 0], [-1] * 5],
    ids=["shared-decode", "shared-prefill", "mixed", "none"],
)
def test_the_whole_layer_method_matches_vllms_wrapper(token_adapters):
    """A fused q/k/v layer (three slices of different widths), bf16 as agentrl serves it."""
    torch.manual_seed(4)
    count, slices = len(token_adapters), (40, 16, 16)
    a = tuple(torch.randn(3, 1, 8, 48, dtype=torch.bfloat16) for _ in slices)
    b = tuple(torch.randn(3, 1, width, 8, dtype=torch.bfloat16) for width in slices)
    x_NI, base_NO = torch.randn(count, 48, dtype=torch.bfloat16), torch.randn(count, 72, dtype=torch.bfloat16)
    expected, got = base_NO.clone(), base_NO.clone()
    vllm_wrapper, our_wrapper = wrapper_for(token_adapters), wrapper_for(token_adapters)
    VLLM_ADD_LORA_LINEAR(
        vllm_wrapper, expected, x_NI, tuple(map(with_zero_slot, a)), tuple(map(with_zero_slot, b)), 0.5, slices
    )
    grouped.add_lora_linear(our_wrapper, got, x_NI, a, b, 0.5, slices)
    torch.testing.assert_close(got, expected, rtol=2e-2, atol=0.25)  # products of ~50 bf16 terms
    assert not torch.equal(got, base_NO) or set(token_adapters) == {-1}  # the LoRA was applied
    our_wrapper.is_prefill = False  # the decode path reads the per-token indices instead
    decoded = base_NO.clone()
    grouped.add_lora_linear(our_wrapper, decoded, x_NI, a, b, 0.5, slices)
    torch.testing.assert_close(decoded, got)


def test_the_fused_layer_follows_an_adapter_loaded_into_its_slot_in_place():
    """vLLM loads an adapter by copying it into the stacked weights' slot; the fused copy built for the
    slot's previous adapter must not be served after that, nor after the slot is zeroed."""
    torch.manual_seed(5)
    slices = (40, 16, 16)
    a = tuple(torch.randn(2, 1, 8, 48, dtype=torch.bfloat16) for _ in slices)
    b = tuple(torch.randn(2, 1, width, 8, dtype=torch.bfloat16) for width in slices)
    x_NI = torch.randn(4, 48, dtype=torch.bfloat16)
    wrapper = wrapper_for([1] * 4)

    def applied() -> torch.Tensor:
        y_NO = torch.zeros(4, 72, dtype=torch.bfloat16)
        grouped.add_lora_linear(wrapper, y_NO, x_NI, a, b, 1.0, slices)
        expected = torch.zeros(4, 72, dtype=torch.bfloat16)
        VLLM_ADD_LORA_LINEAR(
            wrapper_for([1] * 4),
            expected,
            x_NI,
            tuple(map(with_zero_slot, a)),
            tuple(map(with_zero_slot, b)),
            1.0,
            slices,
        )
        torch.testing.assert_close(y_NO, expected, rtol=2e-2, atol=0.25)
        return y_NO

    first = applied()
    for stacked in (*a, *b):  # as vLLM's set_lora: copy the new adapter into slot 1, in place
        stacked[1, 0].copy_(torch.randn_like(stacked[1, 0]))
    assert not torch.equal(applied(), first)
    for stacked in (*a, *b):  # as vLLM's reset_lora
        stacked[1] = 0
    assert applied().abs().max() == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_prepacked_matmul_is_onednns_where_it_packs_the_weight_and_torchs_elsewhere(dtype):
    """The fused layer's two matmuls run through vLLM's oneDNN handler (the weight packed once per
    adapter load) wherever it takes the weight: always float32, bf16 on a CPU with native bf16 (an
    AVX2-only CPU's oneDNN refuses bf16); float16, which it refuses here, falls back to torch."""
    from vllm import _custom_ops as ops

    from agentrl.backend.serving.server import server_dtype

    def onednn_packs(dtype: torch.dtype) -> bool:
        try:
            ops.create_onednn_mm(torch.zeros(8, 8, dtype=dtype), 32)
        except RuntimeError:
            return False
        return True

    torch.manual_seed(6)
    weight_KN, inputs_NK = torch.randn(48, 24, dtype=dtype), torch.randn(5, 48, dtype=dtype)
    matmul = grouped.prepacked_matmul(weight_KN)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        got = matmul(inputs_NK)
    tolerance = {"rtol": 1e-5, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 0.25}
    torch.testing.assert_close(got.float(), inputs_NK.float() @ weight_KN.float(), **tolerance)
    torch.testing.assert_close(matmul(inputs_NK[:1]).float(), got[:1].float())  # other batch sizes too
    called = {event.name for event in profile.events()}
    assert ("_C::onednn_mm" in called) == (ops._supports_onednn and onednn_packs(dtype)), called
    served_here = getattr(torch, server_dtype("auto", gpu=False))  # the type agentrl serves in on this CPU
    if ops._supports_onednn and dtype == served_here:
        assert "_C::onednn_mm" in called, called


def test_one_row_expands_into_the_first_row_only_as_vllm_does():
    torch.manual_seed(1)
    y_1R, b = torch.randn(1, 8), torch.randn(2, 1, 40, 8)
    expected, got = torch.zeros(5, 40), torch.zeros(5, 40)
    VLLM_EXPAND(y_1R, b, expected, torch.tensor([1]), True)
    grouped.bgmv_expand(y_1R, b, got, torch.tensor([1]), True)
    torch.testing.assert_close(got, expected)


def test_the_plugin_is_off_without_its_variable_and_swaps_the_ops_with_it(monkeypatch):
    from vllm.lora.ops import torch_ops
    from vllm.lora.punica_wrapper import punica_cpu

    for module in (vllm_ops, torch_ops, punica_cpu):  # undone after the test
        for name in grouped.OPS:
            if hasattr(module, name):
                monkeypatch.setattr(module, name, getattr(module, name))
    monkeypatch.setattr(PunicaWrapperCPU, "add_lora_linear", VLLM_ADD_LORA_LINEAR)
    monkeypatch.delenv(grouped.ENV, raising=False)
    grouped.register()
    assert punica_cpu.bgmv_shrink is VLLM_SHRINK
    monkeypatch.setenv(grouped.ENV, "1")
    grouped.register()
    assert punica_cpu.bgmv_shrink is grouped.bgmv_shrink and vllm_ops.bgmv_expand is grouped.bgmv_expand
    assert punica_cpu.sgmv_expand_slice is grouped.sgmv_expand_slice
    assert PunicaWrapperCPU.add_lora_linear is grouped.add_lora_linear  # what vLLM's LoRA layers call


def test_one_adapter_adds_into_the_layers_output_in_place_without_a_copy():
    """The rollout phase's path: two matmuls and one in-place add per fused layer. `y[:, :w] += z` would
    also copy the sum back onto itself (Python's setitem), a full pass over y in every layer."""
    torch.manual_seed(7)
    slices = (40, 16, 16)
    a = tuple(torch.randn(2, 1, 8, 48, dtype=torch.bfloat16) for _ in slices)
    b = tuple(torch.randn(2, 1, width, 8, dtype=torch.bfloat16) for width in slices)
    x_NI, y_NO = torch.randn(32, 48, dtype=torch.bfloat16), torch.zeros(32, 72, dtype=torch.bfloat16)
    wrapper = wrapper_for([1] * 32)
    grouped.add_lora_linear(wrapper, y_NO, x_NI, a, b, 1.0, slices)  # builds the fused weights once
    before = y_NO.clone()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        grouped.add_lora_linear(wrapper, y_NO, x_NI, a, b, 1.0, slices)
    counts = {event.key: event.count for event in profile.key_averages()}
    assert "aten::copy_" not in counts and counts.get("aten::add_") == 1, counts
    torch.testing.assert_close(y_NO - before, before, rtol=2e-2, atol=0.25)  # the same LoRA added again
