"""The grouped CPU LoRA ops (agentrl_vllm.lora_ops) give what vLLM's own torch ops give, for one
adapter, several, "no adapter" (index -1), and each op's output handling; the plugin is off unless
its environment variable is set, and swaps the ops in when it is."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm")

from vllm.lora.ops.torch_ops import lora_ops as vllm_ops  # noqa: E402

import agentrl_vllm.lora_ops as grouped  # noqa: E402

VLLM_SHRINK, VLLM_EXPAND, VLLM_EXPAND_SLICE = vllm_ops.bgmv_shrink, vllm_ops.bgmv_expand, vllm_ops.bgmv_expand_slice


def test_the_reference_is_vllms_own_code():
    for op in (VLLM_SHRINK, VLLM_EXPAND, VLLM_EXPAND_SLICE):
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
    VLLM_SHRINK(x_NI, a, expected, indices_N, 0.5)
    grouped.bgmv_shrink(x_NI, a, got, indices_N, 0.5)
    torch.testing.assert_close(got, expected, **tolerance)

    base = torch.randn(len(indices), 40, dtype=dtype)
    for add_inputs in (True, False):
        expected_out, got_out = base.clone(), base.clone()
        VLLM_EXPAND(expected, b, expected_out, indices_N, add_inputs)
        grouped.bgmv_expand(expected, b, got_out, indices_N, add_inputs)
        torch.testing.assert_close(got_out, expected_out, **tolerance)

        wide = torch.randn(len(indices), 100, dtype=dtype)
        expected_wide, got_wide = wide.clone(), wide.clone()
        VLLM_EXPAND_SLICE(expected, b, expected_wide, indices_N, 30, 40, add_inputs)
        grouped.bgmv_expand_slice(expected, b, got_wide, indices_N, 30, 40, add_inputs)
        torch.testing.assert_close(got_wide, expected_wide, **tolerance)


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
        for name in ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice"):
            monkeypatch.setattr(module, name, getattr(module, name))
    monkeypatch.delenv(grouped.ENV, raising=False)
    grouped.register()
    assert punica_cpu.bgmv_shrink is VLLM_SHRINK
    monkeypatch.setenv(grouped.ENV, "1")
    grouped.register()
    assert punica_cpu.bgmv_shrink is grouped.bgmv_shrink and vllm_ops.bgmv_expand is grouped.bgmv_expand
