"""One GRPO step with torch + peft: advantages, tokens, micro-batched loss, one optimizer step.

The base model is frozen in bf16 and the LoRA weights (and AdamW's state) are fp32; compute runs under
bf16 autocast, on CPU as on GPU (all float32 on a CPU without native bf16: `precision`), with LoRA
fused into addmms (`lora_forward`), logits only at loss positions (`logprobs`), and on a CPU matmul
attention for short sequences (`attention`). Gradients accumulate over token-budgeted micro-batches
(`micro_batches`), the loss divided by one denominator for the whole step, so accumulation gives the
update one big batch would (`grpo_loss`), halved where a step outgrows the GPU (`memory`); ranks under
`torch.distributed` (`ranks`) sum their gradients once before the optimizer step (`gradients`), so M
ranks apply the update one rank would. The model, its adapters and their checkpoints: `adapter_host`.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch
from tqdm.auto import tqdm

from agentrl.backend.training.adapter_trainer import StepOutcome
from agentrl.backend.training.adapters.adapter_host import AdapterHost
from agentrl.backend.training.step.gradients import (
    Adapter,
    apply_gradients,
    most_across_ranks,
    read_sums,
    set_optimizer,
    sum_across_ranks,
)
from agentrl.backend.training.step.grpo_loss import MAX_NAMES, GRPOLoss, loss_metrics
from agentrl.backend.training.step.logprobs import takes_tree_mask, token_logprobs
from agentrl.backend.training.step.memory import within_memory
from agentrl.backend.training.step_input import TrainingConditions
from agentrl.data.trajectory import History
from agentrl.data.trajectory_group import TrajectoryGroup
from agentrl.foundation.config import TrainConfig
from agentrl.foundation.errors import ConfigurationError
from agentrl.foundation.timeline import span
from agentrl.rl.advantages import compute_group_advantages, scaled_by_mean_abs
from agentrl.rl.engine_context import tokenize_groups
from agentrl.rl.ledger import StepCounts, group_tokens
from agentrl.rl.losses import loss_denominator
from agentrl.rl.micro_batches import MicroBatches, TokenBatch, collate, collate_rows, plan_step
from agentrl.rl.sequence_weights import per_sequence_denominators
from agentrl.rl.tokenize import TokenizedSequence, tokenize_history

_Passes = TypeVar("_Passes")


class Trainer(AdapterHost):
    """The steps that update an `AdapterHost`'s adapters: GRPO (`train_step`) and supervised (`sft_step`) steps
    over token-budgeted micro-batches, and the log-probabilities an adapter gives (`logprobs_of`)."""

    # --- the step ---

    def train_step(self, name: str, groups: Sequence[TrajectoryGroup], config: TrainConfig) -> StepOutcome:
        """One optimizer step of adapter `name` on these groups (none if no group carries a signal)."""
        started = time.perf_counter()
        adapter = self._activate(name)
        advantages = compute_group_advantages([g.rewards for g in groups], **config.advantage_settings)
        metrics: dict[str, float] = {
            "num_groups": float(len(groups)),
            "num_trajectories": float(sum(len(g.trajectories) for g in groups)),
            "frac_zero_variance_groups": advantages.num_dropped_groups / max(len(groups), 1),
        }
        kept_groups = [groups[i] for i in advantages.kept_group_indices]
        tokenized = tokenize_groups(
            kept_groups,
            advantages.advantages_P_G,
            self.tokenizer,
            allow_missing_logprobs=config.allow_training_without_logprobs,
            require_exact_context=config.require_exact_context,
        )
        per_sequence = config.optimizer_step_per == "sequence"
        sequences = scaled_by_mean_abs(
            tokenized.sequences,
            enabled=config.scale_advantages_by_mean_abs,
            per="conversation" if per_sequence else "token",
        )
        metrics["num_skipped_trajectories"] = float(tokenized.num_skipped_trajectories)
        metrics["sampled_turns"] = float(tokenized.num_turns)  # the turns this step trains ...
        metrics["context_exact_turns"] = float(tokenized.num_exact_turns)  # ... in the engine's own context
        counts = StepCounts(
            zero_variance_groups=advantages.num_dropped_groups,
            skipped_trajectories=tokenized.num_skipped_trajectories,
            tokens_zero_variance=group_tokens(groups) - group_tokens(kept_groups),
            tokens_no_token_data=tokenized.num_skipped_tokens,
        )
        metrics["tokenize_s"] = time.perf_counter() - started
        if not sequences:
            return StepOutcome(updated=False, metrics=metrics, counts=counts)

        num_loss_tokens = sum(sum(s.loss_mask_T[1:]) for s in sequences)
        max_norm = config.max_grad_norm if config.max_grad_norm > 0 else math.inf
        train_started = time.perf_counter()
        if per_sequence:
            sums, plan, grad_norm, metrics["learning_rate"] = self._steps_per_sequence(adapter, sequences, config)
            metrics["optimizer_steps"] = float(len(sequences))
        else:
            denominator = loss_denominator(
                config.loss_normalization,
                num_tokens=num_loss_tokens,
                num_sequences=tokenized.num_histories,
                constant=config.normalization_constant,
                num_zero_variance_tokens=counts.tokens_zero_variance,
            )
            metrics["learning_rate"] = set_optimizer(adapter, config, num_sequences=tokenized.num_histories)
            sums_on_device, plan = self._within_memory(
                adapter,
                config.micro_batch_tokens,
                lambda max_tokens: self._accumulate_gradients(sequences, config, denominator, max_tokens),
            )
            metrics.update(sum_across_ranks(adapter, sums_on_device, self.world_size, maxima=MAX_NAMES))
            sums = read_sums(sums_on_device)
            grad_norm = apply_gradients(adapter, max_norm, loss=sums["loss"], sharded=self.sharded)
            metrics["optimizer_steps"] = 1.0

        metrics.update(loss_metrics(sums, num_loss_tokens))
        masked = round(sums["masked"])
        counts = dataclasses.replace(counts, tokens_trained=num_loss_tokens - masked, tokens_masked=masked)
        metrics.update(
            trained_tokens=float(num_loss_tokens),
            total_tokens=float(sum(len(s) for s in sequences)),
            forward_tokens=float(plan.forward_tokens),
            shared_prefix=float(plan.packed),
            num_sequences=float(len(sequences)),
            micro_batch_tokens=float(plan.max_tokens),
            grad_norm=grad_norm,
            train_s=time.perf_counter() - train_started,
        )
        return StepOutcome(updated=True, metrics=metrics, conditions=self._conditions(plan), counts=counts)

    def _steps_per_sequence(
        self, adapter: Adapter, sequences: list[TokenizedSequence], config: TrainConfig
    ) -> tuple[dict[str, float], MicroBatches, float, float]:
        """`TrainConfig.optimizer_step_per="sequence"`: one clipped AdamW step per sequence, in order, each on its
        own loss (`per_sequence_denominators`). Returns the summed running sums (maxima: the largest; the loss: the
        steps' mean), the last step's plan (its forward tokens: all the steps'), the mean gradient norm and the learning rate."""
        if self.world_size > 1:
            raise ConfigurationError(
                "TrainConfig(optimizer_step_per='sequence') takes one step per sequence on one trainer rank; with "
                f"{self.world_size} ranks use optimizer_step_per='step'"
            )
        learning_rate = set_optimizer(adapter, config, num_sequences=1)
        max_norm = config.max_grad_norm if config.max_grad_norm > 0 else math.inf
        totals: dict[str, float] = {}
        grad_norms: list[float] = []
        forward_tokens = 0
        plan: MicroBatches | None = None
        for sequence, denominator in zip(sequences, per_sequence_denominators(sequences, config), strict=True):

            def passes(
                max_tokens: int, one: TokenizedSequence = sequence, divisor: float = denominator
            ) -> tuple[dict[str, torch.Tensor], MicroBatches]:
                return self._accumulate_gradients([one], config, divisor, max_tokens)

            sums_on_device, plan = self._within_memory(adapter, config.micro_batch_tokens, passes)
            sums = read_sums(sums_on_device)
            grad_norms.append(apply_gradients(adapter, max_norm, loss=sums["loss"], sharded=self.sharded))
            forward_tokens += plan.forward_tokens
            for name, value in sums.items():
                totals[name] = (
                    max(totals.get(name, value), value) if name in MAX_NAMES else totals.get(name, 0.0) + value
                )
        assert plan is not None
        totals["loss"] /= len(sequences)  # the mean of the steps' losses, comparable with one step's
        return (
            totals,
            dataclasses.replace(plan, forward_tokens=forward_tokens),
            sum(grad_norms) / len(grad_norms),
            learning_rate,
        )

    def _conditions(self, plan: MicroBatches) -> TrainingConditions:  # what a bit-exact replay of the step needs
        return TrainingConditions.here(
            plan.max_tokens, bf16=self.bf16, device=self.device.type, ranks=self.world_size, sharded=self.sharded
        )

    def _micro_batches(
        self, sequences: list[TokenizedSequence], max_tokens: int, *, shared_prefix: bool | None = False
    ) -> MicroBatches:
        """This rank's plan (see `plan_step`), packing a group's sequences as a token tree where
        `shared_prefix` asks (True), or where that saves tokens (None) and the attention takes a mask."""
        can_pack = takes_tree_mask(self.model)
        if shared_prefix and not can_pack:
            raise ConfigurationError(
                "TrainConfig(shared_prefix=True) needs an attention implementation that takes a mask (sdpa or "
                f"eager); this model uses {self.model.get_base_model().config._attn_implementation!r}. "
                "Leave shared_prefix=None (packs where it can) or set it False"
            )
        pack_groups = shared_prefix if can_pack else False
        plan = plan_step(sequences, max_tokens, rank=self.rank, world_size=self.world_size, pack_groups=pack_groups)
        return plan.padded_to(most_across_ranks(len(plan.batches), self.device)) if self.sharded else plan

    def _idle_pass(self, *, with_reference: bool) -> None:
        """A forward and backward that adds nothing to any gradient: a sharded rank with fewer
        micro-batches than another joins the layer gathers of the other's passes."""
        pad = self.pad_token_id
        batch = collate([TokenizedSequence([pad, pad], [False, False], [0.0, 0.0], 0.0, 0)], pad).to(self.device)
        decoder = self.model.get_base_model().model
        with self._autocast():
            if with_reference:
                with torch.no_grad(), self.model.disable_adapter():
                    decoder(input_ids=batch.input_ids_BT)
            hidden_BTH = decoder(input_ids=batch.input_ids_BT).last_hidden_state
        (hidden_BTH.float().sum() * 0.0).backward()

    def _within_memory(self, adapter: Adapter, requested: int | None, passes: Callable[[int], _Passes]) -> _Passes:
        """`passes` at the config's micro-batch size, or at the trainer's default, halved for good where a
        step outgrows the GPU (see `memory`)."""
        result, self.micro_batch_tokens = within_memory(
            passes,
            requested=requested,
            default=self.micro_batch_tokens,
            can_halve=self.world_size == 1,  # ranks must agree on one plan
            device=self.device,
            drop_gradients=lambda: adapter.optimizer.zero_grad(set_to_none=True),
        )
        return result

    def _passes(
        self,
        sequences: list[TokenizedSequence],
        max_tokens: int,
        micro_batch_loss: Callable[[TokenBatch, torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor],
        *,
        shared_prefix: bool | None,
        reference: tuple[str, int | str | None] | None,
        desc: str,
    ) -> tuple[torch.Tensor, MicroBatches]:
        """Forward and backward over this rank's micro-batches of at most `max_tokens` tokens, each one's
        loss from `micro_batch_loss(batch, logprobs_BT, entropy_N, ref_logprobs_BT)`: the KL reference's
        logprobs where `reference` = (trained adapter, reference folder or None for the base) is given, else
        None. Returns the summed loss (on the device) and the plan."""
        self.model.train()
        loss_sum = torch.zeros((), device=self.device)
        plan = self._micro_batches(sequences, max_tokens, shared_prefix=shared_prefix)
        # Rank 0's bar: micro-batches done and the running loss (one small device read per micro-batch).
        bar = tqdm(total=len(plan.batches), desc=desc, unit="micro-batch", leave=False, disable=self.rank != 0)
        for rows in plan.batches:
            if rows is None:
                self._idle_pass(with_reference=reference is not None)
                bar.update(1)
                continue
            batch, packed = collate_rows(sequences, rows, plan.packed, self.pad_token_id, self.device)
            ref_logprobs_BT = None
            with span(f"{desc}: micro-batch", "trainer", tokens=batch.input_ids_BT.numel()):
                with self._autocast():
                    if reference is not None:
                        with self.kl_reference.active(self.model, *reference):
                            ref_logprobs_BT, _ = token_logprobs(self.model, batch, packed)
                    logprobs_BT, entropy_N = token_logprobs(self.model, batch, packed)
                loss = micro_batch_loss(batch, logprobs_BT, entropy_N, ref_logprobs_BT)
                torch.autograd.backward(loss)
            loss_sum += loss.detach()
            if not bar.disable and self.device.type != "meta":  # a meta device has no values to show
                bar.set_postfix(loss=f"{loss_sum.item():.4f}", refresh=False)
            bar.update(1)
        bar.close()
        return loss_sum, plan

    def _accumulate_gradients(
        self, sequences: list[TokenizedSequence], config: TrainConfig, denominator: float, max_tokens: int
    ) -> tuple[dict[str, torch.Tensor], MicroBatches]:
        """A GRPO step's passes over micro-batches of at most `max_tokens` tokens. Returns the step's
        running sums (tensors on the device), and the plan it followed."""
        loss = GRPOLoss(config, denominator, self.device)
        loss.sums["loss"], plan = self._passes(
            sequences,
            max_tokens,
            loss,
            shared_prefix=config.shared_prefix,
            reference=(self.model.active_adapter, config.kl_reference) if config.needs_reference else None,
            desc="train step",
        )
        return loss.sums, plan

    def sft_step(
        self,
        name: str,
        histories: Sequence[History],
        *,
        learning_rate: float,
        micro_batch_tokens: int | None,
        shared_prefix: bool | None = None,
        assistant_turns: str = "all",
    ) -> StepOutcome:
        """One supervised step of adapter `name`: mean negative log-likelihood of the demonstrated assistant turns
        (`assistant_turns="last"`: of each demonstration's last one). Demonstrations that start alike (a system
        prompt, tool schemas) share those tokens' computation (`shared_prefix`, as in `TrainConfig`)."""
        started = time.perf_counter()
        adapter = self._activate(name)
        sequences = [
            tokenize_history(
                h,
                self.tokenizer,
                train_on_written_assistant=True,
                trained_turns=None if assistant_turns == "all" else frozenset({_assistant_turns(h) - 1}),
            )
            for h in histories
        ]
        sequences = [s for s in sequences if any(s.loss_mask_T)]
        if not sequences:
            return StepOutcome(updated=False, metrics={"tokenize_s": time.perf_counter() - started})
        num_loss_tokens = sum(sum(s.loss_mask_T[1:]) for s in sequences)
        for group in adapter.optimizer.param_groups:
            group["lr"] = learning_rate
        tokenize_s = time.perf_counter() - started

        def nll(batch: TokenBatch, logprobs_BT: torch.Tensor, *_: torch.Tensor | None) -> torch.Tensor:
            return -(logprobs_BT * batch.loss_mask_BT[:, 1:]).sum() / num_loss_tokens

        def passes(max_tokens: int) -> tuple[torch.Tensor, MicroBatches]:
            return self._passes(
                sequences, max_tokens, nll, shared_prefix=shared_prefix, reference=None, desc="sft step"
            )

        nll_sum, plan = self._within_memory(adapter, micro_batch_tokens, passes)
        sums = {"nll": nll_sum}
        sum_across_ranks(adapter, sums, self.world_size)
        total_nll = float(sums["nll"])
        grad_norm = apply_gradients(adapter, 1.0, loss=total_nll, sharded=self.sharded)
        return StepOutcome(
            updated=True,
            metrics={
                "sft_loss": total_nll,
                "trained_tokens": float(num_loss_tokens),
                "total_tokens": float(sum(len(s) for s in sequences)),
                "forward_tokens": float(plan.forward_tokens),
                "num_sequences": float(len(sequences)),
                "grad_norm": grad_norm,
                "tokenize_s": tokenize_s,
                "train_s": time.perf_counter() - started - tokenize_s,
            },
            conditions=self._conditions(plan),
        )

    @torch.no_grad()
    def logprobs_of(self, name: str, sequences: Sequence[TokenizedSequence]) -> list[list[float]]:
        """Adapter `name`'s log-probabilities of each sequence's loss tokens (for checks against the sampler)."""
        self._activate(name)
        self.model.eval()
        result = []
        for seq in sequences:
            batch = collate([seq], self.pad_token_id).to(self.device)
            with self._autocast():
                logprobs_BT, _ = token_logprobs(self.model, batch)
            result.append(logprobs_BT[batch.loss_mask_BT[:, 1:].bool()].tolist())
        return result


def _assistant_turns(history: History) -> int:
    """How many assistant turns (written or sampled) a demonstration holds."""
    return sum(1 for m in history.messages() if m.get("role") == "assistant")
