"""Log-probabilities and entropies of the loss tokens, without keeping full-vocabulary logits.

With SmolLM2's 49,152-token vocabulary, fp32 log-softmax over every loss position, its gradient,
and the entropy's exp each wrote a (positions x vocabulary) tensor: a fifth of a training step
here. `SelectedLogprobs` walks the positions in chunks: it computes a chunk's logits in the model's
dtype, reduces them in fp32 to the target's logprob, the log-normalizer and the entropy, and keeps
only the normalizer; the backward recomputes each chunk's logits (one more head matmul) and
writes the gradient straight into the hidden states'.
"""

from __future__ import annotations

from typing import Any

import torch

from agentrl.rl.micro_batches import TokenBatch
from agentrl.rl.packing import PackedBatch


def chunk_positions(device: torch.device, dtype: torch.dtype = torch.bfloat16) -> int:
    """Positions per chunk. On a CPU in bf16, 64 x 49,152 fp32 logits (12 MiB) mostly stay in cache:
    measured there, the elementwise passes ran 3-10x faster per position than over 256-position (48 MiB)
    chunks, and the head's matmul is still efficient (32 rows: 10% slower steps). In float32 (a CPU
    without bf16) each chunk streams the 113 MiB head from memory once per pass, so larger chunks win:
    700 positions forward and backward took 1.68 s in chunks of 64, 1.41 s of 128 or 256, 1.52 s of 512
    (2-core AMD EPYC). A GPU wants large chunks to fill its cores."""
    if device.type != "cpu":
        return 4096
    return 128 if dtype == torch.float32 else 64


def _chunks(positions: torch.Tensor, dtype: torch.dtype) -> list[slice]:
    """Slices over the positions of `positions`, a chunk each (views, no gathered copies)."""
    size = chunk_positions(positions.device, dtype)
    return [slice(start, start + size) for start in range(0, len(positions), size)]


class SelectedLogprobs(torch.autograd.Function):
    """log softmax(hidden @ head^T)[target] per position, and the distribution's entropy (no gradient)."""

    @staticmethod
    def forward(ctx: Any, hidden_NH: torch.Tensor, head_VH: torch.Tensor, targets_N: torch.Tensor) -> Any:
        logprobs_N = hidden_NH.new_empty(targets_N.shape, dtype=torch.float32)
        entropy_N = torch.empty_like(logprobs_N)
        log_normalizer_N = torch.empty_like(logprobs_N)
        for rows in _chunks(targets_N, hidden_NH.dtype):
            logits_CV = (hidden_NH[rows] @ head_VH.t()).float()
            log_normalizer_C = torch.logsumexp(logits_CV, dim=-1)
            probs_CV = torch.exp(logits_CV - log_normalizer_C[:, None])
            log_normalizer_N[rows] = log_normalizer_C
            logprobs_N[rows] = logits_CV.gather(1, targets_N[rows, None]).squeeze(1) - log_normalizer_C
            entropy_N[rows] = log_normalizer_C - (probs_CV * logits_CV).sum(dim=-1)
        ctx.save_for_backward(hidden_NH, head_VH, targets_N, log_normalizer_N)
        ctx.mark_non_differentiable(entropy_N)
        return logprobs_N, entropy_N

    @staticmethod
    def backward(ctx: Any, grad_logprobs_N: torch.Tensor, _grad_entropy: torch.Tensor) -> Any:
        hidden_NH, head_VH, targets_N, log_normalizer_N = ctx.saved_tensors
        grad_hidden_NH = torch.empty_like(hidden_NH)
        for rows in _chunks(targets_N, hidden_NH.dtype):
            logits_CV = (hidden_NH[rows] @ head_VH.t()).float()
            # d logprob / d logits = onehot(target) - softmax, scaled by the incoming gradient
            grad_logits_CV = torch.exp(logits_CV - log_normalizer_N[rows, None]).mul_(-grad_logprobs_N[rows, None])
            grad_logits_CV.scatter_add_(1, targets_N[rows, None], grad_logprobs_N[rows, None])
            grad_hidden_NH[rows] = grad_logits_CV.to(head_VH.dtype) @ head_VH
        return grad_hidden_NH, None, None  # the head is frozen (token_logprobs checks)


TREE_MASK_ATTENTION = ("agentrl_cpu", "sdpa", "eager")
"""Attention implementations that take a packed row's tree-shaped mask (flash-attention kernels take none)."""


def _causal_lm(model: torch.nn.Module) -> Any:
    """The transformers CausalLM under `model` (peft wraps it)."""
    get_base_model = getattr(model, "get_base_model", None)
    return get_base_model() if get_base_model is not None else model


def takes_tree_mask(model: torch.nn.Module) -> bool:
    """Whether `model` (peft-wrapped or not) can run packed token trees (`agentrl.rl.packing`)."""
    return _causal_lm(model).config._attn_implementation in TREE_MASK_ATTENTION


def token_logprobs(
    model: torch.nn.Module, batch: TokenBatch, packed: PackedBatch | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities of the loss tokens under `model`, and their entropies.

    Returns `logprobs_BT` of shape (B, T-1), where column t is token t+1 given tokens <= t (the
    same alignment as `batch.*_BT[:, 1:]`), zero off the loss mask; and the entropy of each loss
    position's distribution, flat. Logits exist only at loss positions, a chunk at a time.

    The batch is right-padded, so no real token sits after a pad and the causal mask alone keeps
    pads out of every real token's attention: the decoder gets no attention mask, which lets it
    use its causal kernels instead of building a (B, 1, T, T) mask.

    With `packed` (the batch's sequences as token trees, `agentrl.rl.packing`), the decoder runs on
    the trees' rows under their tree-shaped mask, and each loss position reads its node's hidden state.
    """
    causal_lm = _causal_lm(model)
    targets_mask_BT = batch.loss_mask_BT[:, 1:].bool()
    if packed is None:
        hidden_BTH = causal_lm.model(input_ids=batch.input_ids_BT, use_cache=False).last_hidden_state
        hidden_NH = hidden_BTH[:, :-1][targets_mask_BT]
    else:
        attention_R1NN = packed.attention_R1NN
        if causal_lm.config._attn_implementation == "eager":  # eager adds its mask to the scores
            dtype = causal_lm.get_input_embeddings().weight.dtype
            attention_R1NN = torch.zeros(attention_R1NN.shape, dtype=dtype, device=attention_R1NN.device).masked_fill(
                ~attention_R1NN, torch.finfo(dtype).min
            )
        hidden_RNH = causal_lm.model(
            input_ids=packed.input_ids_RN,
            position_ids=packed.position_ids_RN,
            attention_mask=attention_R1NN,
            use_cache=False,
        ).last_hidden_state
        hidden_NH = hidden_RNH.flatten(0, 1)[packed.node_of_BT[:, :-1][targets_mask_BT]]
    targets_N = batch.input_ids_BT[:, 1:][targets_mask_BT]
    head = causal_lm.lm_head
    if type(head) is torch.nn.Linear and head.bias is None and not head.weight.requires_grad:
        logprobs_N, entropy_N = SelectedLogprobs.apply(hidden_NH, head.weight.to(hidden_NH.dtype), targets_N)
    else:  # a trained or biased head (LoRA on lm_head): full logits, autograd throughout
        logprobs_NV = torch.log_softmax(head(hidden_NH).float(), dim=-1)
        logprobs_N = logprobs_NV.gather(1, targets_N[:, None]).squeeze(1)
        entropy_N = -(logprobs_NV.exp() * logprobs_NV).sum(dim=-1).detach()
    logprobs_BT = logprobs_N.new_zeros(targets_mask_BT.shape).masked_scatter(targets_mask_BT, logprobs_N)
    return logprobs_BT, entropy_N
