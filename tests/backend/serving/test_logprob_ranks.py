"""agentrl_vllm.logprob_ranks: vLLM's sampler, with the plugin on, returns the ranks its own count
returns (ties included, both number types); off unless its environment variable is set."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm")

from vllm.v1.sample import sampler as vllm_sampler  # noqa: E402

import agentrl_vllm.logprob_ranks as eager  # noqa: E402

VLLM_COUNT = vllm_sampler.batched_count_greater_than
# vLLM's count as its source says, run eagerly: a compiled kernel comes from torch.compile's cache, whose keys
# leave out the CPU caps scripts/avx2_only.sh lowers; one cached under other caps counted 450 (or 1884) where
# 884 was right.
VLLM_COUNT_SOURCE = VLLM_COUNT.__wrapped__


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_sampler_gives_the_ranks_vllms_count_gives(monkeypatch, dtype):
    generator = torch.Generator().manual_seed(0)
    logprobs_NV = torch.randn(7, 1000, generator=generator).log_softmax(-1).to(dtype)
    logprobs_NV[:, 500:] = logprobs_NV[:, :500]  # every value twice: ties count as ranking above
    token_ids_N = torch.tensor([0, 3, 999, 500, 42, 1, 777])

    def gathered() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        tensors = vllm_sampler.Sampler.gather_logprobs(logprobs_NV, 2, token_ids_N)
        return tensors.logprob_token_ids, tensors.logprobs, tensors.selected_token_ranks

    monkeypatch.setattr(vllm_sampler, "batched_count_greater_than", VLLM_COUNT)  # undone after the test
    monkeypatch.setenv(eager.ENV, "0")
    eager.register()
    assert vllm_sampler.batched_count_greater_than is VLLM_COUNT  # off: vLLM's own count stays
    monkeypatch.setattr(vllm_sampler, "batched_count_greater_than", VLLM_COUNT_SOURCE)
    vllms = gathered()
    monkeypatch.setenv(eager.ENV, "1")
    eager.register()
    assert vllm_sampler.batched_count_greater_than is eager.count_at_least
    for got, expected in zip(gathered(), vllms, strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
    ranks = vllms[2]
    assert ranks.tolist() == [int((row >= row[t]).sum()) for row, t in zip(logprobs_NV, token_ids_N, strict=True)]
    assert ranks.min() >= 2  # each value appears twice, so no token ranks first alone
