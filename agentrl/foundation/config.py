"""Configuration: `TrainConfig` for the knobs a user tunes per step; LoRA and server settings per model.

Every default lives here and nowhere else. Sentinels are spelled out in the field docs ("0 = off").
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


# Every number must be finite: an `inf` learning rate or KL weight turns the adapter into NaN in one step.
class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# --- policy losses: one small config per loss, listed once in `LossConfig`; each loss function in
# `agentrl.rl.losses` registers for its config type ---


ImportanceSamplingLevel = Literal["token", "sequence", "average", "geometric_average"]
"""Which ratio p/p_sampler a loss weighs each token by: its own ("token"); its sequence's, the geometric
mean of the sequence's token ratios ("sequence"); or the arithmetic ("average") or geometric
("geometric_average") mean of the two (ART's `importance_sampling_level`)."""


class ImportanceSamplingLoss(_Frozen):
    """REINFORCE with an importance ratio against the sampler, no clipping."""

    name: Literal["importance_sampling"] = "importance_sampling"
    importance_sampling_level: ImportanceSamplingLevel = "token"
    """The ratio each token is weighed by (see `ImportanceSamplingLevel`)."""


class PPOLoss(_Frozen):
    """PPO's clipped surrogate, with asymmetric clip bounds (DAPO's clip-higher)."""

    name: Literal["ppo"] = "ppo"
    clip_low: float = Field(default=0.2, gt=0, le=1)
    """Ratio floor is 1 - clip_low (in (0, 1]: the floor stays in [0, 1))."""
    clip_high: float = Field(default=0.28, gt=0)
    """Ratio ceiling is 1 + clip_high."""
    importance_sampling_level: ImportanceSamplingLevel = "token"
    """The ratio that is clipped (see `ImportanceSamplingLevel`)."""
    ratio_cap: float | None = Field(default=None, gt=0)
    """ART's `max_negative_advantage_importance_sampling_weight`: the ratio is capped at this before it is clipped
    (every token's, as ART caps it); None = off."""
    mask_out_of_range: bool = False
    """ART's `mask_prob_ratio`: a ratio outside (1 - clip_low, 1 + clip_high) becomes 0 before the loss (no
    gradient through that token)."""


class CISPOLoss(_Frozen):
    """CISPO: the clipped importance weight, without gradient, scales the log-probability gradient."""

    name: Literal["cispo"] = "cispo"
    clip_low: float = Field(default=1.0, gt=0, le=1)
    """Weight floor is 1 - clip_low (1.0 = no floor, as in MiniMax-M1)."""
    clip_high: float = Field(default=4.0, gt=0)
    """Weight ceiling is 1 + clip_high."""
    importance_sampling_level: ImportanceSamplingLevel = "token"
    """The ratio that is clipped into the weight (see `ImportanceSamplingLevel`)."""
    ratio_cap: float | None = Field(default=None, gt=0)
    """ART's `max_negative_advantage_importance_sampling_weight`: the ratio is capped at this before it is clipped
    (every token's, as ART caps it); None = off."""
    mask_out_of_range: bool = False
    """ART's `mask_prob_ratio`: a ratio outside (1 - clip_low, 1 + clip_high) becomes 0 before the loss (no
    gradient through that token)."""


class DROLoss(_Frozen):
    """DRO: advantage-weighted log-probability minus a quadratic penalty on drift from the sampler."""

    name: Literal["dro"] = "dro"
    beta: float = Field(default=0.05, ge=0)
    """Weight of 0.5 * (logprob - sampler_logprob)^2."""


class GSPOLoss(_Frozen):
    """GSPO: PPO clipping on the sequence-level ratio (geometric mean of token ratios)."""

    name: Literal["gspo"] = "gspo"
    clip_low: float = Field(default=3e-4, gt=0, le=1)
    """Sequence-ratio floor is 1 - clip_low (GSPO's ranges are far tighter than PPO's)."""
    clip_high: float = Field(default=4e-4, gt=0)
    """Sequence-ratio ceiling is 1 + clip_high."""


LossConfig = Annotated[ImportanceSamplingLoss | PPOLoss | CISPOLoss | DROLoss | GSPOLoss, Field(discriminator="name")]
LOSS_CONFIGS: dict[str, type[BaseModel]] = {
    cls.model_fields["name"].default: cls for cls in get_args(get_args(LossConfig)[0])
}
"""Each loss's config by its name, read from `LossConfig` (so a loss is listed once)."""


class TrainConfig(BaseModel):
    """What one `model.train(groups, config)` step does."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    # optimiser
    learning_rate: float = Field(default=1e-5, gt=0)
    """AdamW learning rate for the LoRA weights."""
    weight_decay: float = Field(default=0.0, ge=0)
    """AdamW weight decay."""
    max_grad_norm: float = Field(default=1.0, ge=0)
    """Clip the global gradient norm to this (0 = no clipping)."""
    adam_betas: tuple[float, float] = (0.9, 0.999)
    """AdamW's (beta1, beta2): the decay of its running mean of gradients and of their squares."""
    adam_eps: float = Field(default=1e-8, gt=0)
    """AdamW's epsilon, added to the root of the squared-gradient average before dividing by it."""
    learning_rate_sequence_power: float = 0.0
    """ART's `num_trajectories_learning_rate_multiplier_power`: the step's learning rate is multiplied by
    (sequences it trains) ** power, so a step over more trajectories moves further (0 = off)."""
    optimizer_step_per: Literal["step", "sequence"] = "step"
    """"step": one AdamW step over all the step's sequences, their loss averaged over all their tokens.
    "sequence": one AdamW step per training sequence in turn (ART's LocalBackend, which `agentrl.art` asks for):
    each sequence's loss averaged over its own tokens (a short answer weighs as much as a long one), the KL shaping
    centred per sequence, the mean |advantage| taken per sequence, and the learning rate not scaled by
    `learning_rate_sequence_power` (one sequence a step). Single trainer rank only."""

    # advantages
    scale_advantages_by_std: bool = True
    """Divide `r - mean(r)` by the group's std (GRPO); False keeps the raw difference (Dr. GRPO)."""
    advantage_balance: float = Field(default=0.0, ge=-1, le=1)
    """ART's `advantage_balance`: above 0, negative advantages are multiplied by (1 - balance); below 0, positive ones
    by (1 + balance): how much a step pushes away from bad answers against towards good ones. 0 = off."""
    scale_advantages_by_mean_abs: bool = False
    """Divide the step's advantages by their mean absolute value over its loss tokens, as ART's packing always does
    (`agentrl.art` turns it on): each step moves the adapter about as far, whatever the spread of its rewards."""

    # loss
    loss: LossConfig = Field(default_factory=PPOLoss)
    """The policy loss: a loss config, or its name ("ppo", "cispo", ...) for its defaults."""
    loss_normalization: Literal["tokens", "all_tokens", "constant"] = "tokens"
    """"tokens": divide the summed token losses by the step's trained tokens (DAPO); "all_tokens":
    by those and the tokens of its zero-variance groups (TRL's GRPO: a step of mostly solved groups
    moves the policy less; the main job's setting); "constant": by sequences x `normalization_constant` (Dr. GRPO)."""
    normalization_constant: int = Field(default=1024, gt=0)
    """Tokens per sequence assumed by "constant" normalisation (e.g. the generation budget)."""
    kl_coef: float = Field(default=0.0, ge=0)
    """Weight of the KL penalty to the reference (`kl_reference`: the base model, LoRA disabled, unless set);
    0 = off (no reference pass). In bf16 (GPUs, CPUs with native bf16) the policy and reference passes round
    differently: while the adapter is still near its base, the penalty's gradient is mostly that rounding
    noise (measured: docs/scaling.md)."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """Estimator of KL(policy || reference) per token (Schulman's k1/k2/k3)."""
    kl_advantage_coef: float = Field(default=0.0, ge=0)
    """ART's `kl_penalty_coef`: the KL to the reference (`kl_reference`) shapes the advantages instead of adding
    a loss term. Per loss token, kl = (source - reference logprob), detached; each token's advantage gains
    coef * (mean kl - kl), the mean over the micro-batch's loss tokens, so tokens that drifted further than
    average are pushed back. 0 = off."""
    kl_advantage_source: Literal["current_learner", "sample"] = "current_learner"
    """Whose logprobs `kl_advantage_coef` compares with the reference's: the trainer's (detached) or the sampler's."""
    kl_reference: int | str | None = None
    """What the KL terms (`kl_coef`, `kl_advantage_coef`) measure against. None: the base model (the adapter off).
    A step: that checkpoint of the model being trained (negative: that many steps before the step being
    trained, never before 0). A folder: a peft adapter of the same base (ART's `kl_ref_adapter_path`)."""
    advantage_logprob_tau: float = Field(default=0.0, ge=0)
    """ART's `kimi_k2_tau`: each token's advantage less tau * (trainer - old logprob), detached; 0 = off."""
    truncated_importance_sampling: float = Field(default=0.0, ge=0)
    """Cap C of the sampler->trainer importance weight min(p_trainer/p_sampler, C); 0 = off.
    When on, the trainer's own detached logprobs are the loss's old policy."""
    mismatch_token_mask: tuple[float, float] | None = None
    """(low, high), e.g. (0.5, 2.0): a loss token whose ratio p_trainer/p_sampler lies outside it carries
    no loss (IcePop). For a few tokens the sampler and trainer disagree on wildly (a quantized or
    differently fused sampler, MoE routing): they are dropped, not down-weighted as the cap of
    `truncated_importance_sampling` does. The share masked: metric `token_mask_fraction`."""
    mismatch_sequence_mask: tuple[float, float] | None = None
    """(low, high), e.g. (0.9, 1.1): a sequence whose geometric-mean ratio (the exp of its tokens' mean
    log ratio) lies outside it carries no loss at all. For mismatch spread over a whole answer (long
    multi-turn rollouts, a stale sampler) that no single token shows; the geometric mean keeps long
    and short answers comparable. The share of loss tokens masked: metric `sequence_mask_fraction`."""

    # batching
    micro_batch_tokens: int | None = Field(default=None, gt=0)
    """Tokens per forward/backward pass (padded); bounds memory whatever the group sizes. None: 2,048
    on a CPU (the fastest measured on 2 cores: activations stay in cache), 16,384 on a GPU, halved for
    the rest of the run each time a step runs out of GPU memory (a set size that does not fit raises)."""
    shared_prefix: bool | None = None
    """Compute a group's shared prefix (its prompt, and any turns its rollouts share) once: each
    group's sequences packed as a token tree under a tree-shaped mask (`agentrl.rl.packing`), the
    same loss and gradients for fewer tokens. None: on where it computes at least 10% fewer tokens."""
    max_judge_failure_rate: float = Field(default=0.5, ge=0, le=1)
    """Raise `JudgeError` when judge failures dropped more than this share of the step's groups
    (always when they dropped all of them); below it the step trains and reports the failures."""
    allow_training_without_logprobs: bool = False
    """Skip (and count) trajectories whose assistant turns lack sampled token ids, instead of failing."""
    nonfinite_logprobs_as_missing: bool = False
    """A sampled token whose sampler logprob is NaN or infinite trains as if the sampler were the trainer (ratio 1),
    as ART does, instead of aborting the step (`TrainingError`, nothing applied: agentrl's default, which shows a
    broken sampler at once). `agentrl.art` turns it on."""
    require_exact_context: bool = False
    """Raise `TokenizationError` for a sampled turn whose engine prompt ids are unknown (a Choice built by hand,
    or a completion the gateway no longer keeps) instead of training it in the re-rendered conversation. Off:
    such turns train and are counted (metrics `context_exact_turns` of `sampled_turns`, `agentrl show`)."""

    @field_validator("mismatch_token_mask", "mismatch_sequence_mask")
    @classmethod
    def _bounds_around_one(cls, value: tuple[float, float] | None) -> tuple[float, float] | None:
        if value is not None and not 0 < value[0] < 1 < value[1]:
            raise ValueError(
                f"mismatch mask bounds {value} must be (low, high) with 0 < low < 1 < high, as ratios "
                "p_trainer/p_sampler: e.g. (0.5, 2.0) for tokens, (0.9, 1.1) for sequences"
            )
        return value

    @field_validator("adam_betas")
    @classmethod
    def _betas_below_one(cls, value: tuple[float, float]) -> tuple[float, float]:
        if not all(0 <= beta < 1 for beta in value):
            raise ValueError(f"adam_betas {value} must each lie in [0, 1), e.g. (0.9, 0.999)")
        return value

    @model_validator(mode="after")
    def _reference_with_a_kl_term(self) -> TrainConfig:
        if self.kl_reference is not None and not self.needs_reference:
            raise ValueError(
                f"kl_reference={self.kl_reference!r} changes nothing while kl_coef and kl_advantage_coef are 0: "
                "set one of them, or leave kl_reference None"
            )
        return self

    @field_validator("loss", mode="before")
    @classmethod
    def _loss_from_name(cls, value: Any) -> Any:
        if isinstance(value, str):
            if value not in LOSS_CONFIGS:
                raise ValueError(f"unknown loss {value!r}; choose one of {sorted(LOSS_CONFIGS)}")
            return LOSS_CONFIGS[value]()
        return value

    @property
    def advantage_settings(self) -> dict[str, Any]:
        """`compute_group_advantages`'s keywords from this config."""
        return {"scale_by_std": self.scale_advantages_by_std, "balance": self.advantage_balance}

    @property
    def needs_reference(self) -> bool:
        """Whether a step needs the KL reference's logprobs (a pass with the adapter off, or the reference's on)."""
        return self.kl_coef > 0 or self.kl_advantage_coef > 0


class SFTConfig(BaseModel):
    """What one `model.train_sft(demonstrations, config)` call does (a warm start before RL)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    learning_rate: float = Field(default=5e-4, gt=0)
    """AdamW learning rate for the LoRA weights."""
    epochs: int = Field(default=2, gt=0)
    """Passes over the demonstrations."""
    batch_size: int = Field(default=8, gt=0)
    """Demonstrations per optimizer step."""
    micro_batch_tokens: int | None = Field(default=None, gt=0)
    """Tokens per forward/backward pass (padded); None: the trainer's default for its device (see TrainConfig)."""
    assistant_turns: Literal["all", "last"] = "all"
    """Which assistant turns of each demonstration carry loss: all of them, or only the last (the earlier ones
    stay as context; ART 0.5.20+'s `TrainSFTConfig.assistant_turns`)."""
    shared_prefix: bool | None = None
    """Compute the tokens that a batch's demonstrations start with alike (a system prompt, tool schemas)
    once, as `TrainConfig.shared_prefix` does for a group. None: on where that computes at least 10% fewer tokens."""


class LoRAConfig(_Frozen):
    """The adapter trained on top of the frozen base model."""

    rank: int = Field(default=8, gt=0)
    """LoRA rank r."""
    alpha: int = Field(default=16, gt=0)
    """LoRA scaling numerator (scale = alpha / rank)."""
    dropout: float = Field(default=0.0, ge=0, lt=1)
    """Dropout on the LoRA input."""
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    """Modules that get an adapter: all attention and MLP projections by default."""


class ServerConfig(_Frozen):
    """The inference server (vLLM) that serves the model's current LoRA."""

    max_model_len: int = Field(default=4096, gt=0)
    """Longest prompt + completion, in tokens."""
    max_loras: int = Field(default=2, gt=0)
    """Adapters resident at once (the current one, plus the previous during a swap)."""
    kv_cache_gib: int = Field(default=2, gt=0)
    """KV cache on CPU, in GiB (`VLLM_CPU_KVCACHE_SPACE`)."""
    gpu_memory_utilization: float = Field(default=0.5, gt=0, le=1)
    """Share of GPU memory vLLM may take (GPU only; the trainer shares the card)."""
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    """Weights and activations in the server; "auto": bfloat16 on a GPU or a CPU with native bf16
    (AVX512-BF16, AMX), else float32, which samples 2.7x faster than emulated bf16 on an AVX2 CPU."""
    startup_timeout_s: float = Field(default=300.0, gt=0)
    """How long to wait for the server to answer its health check."""
    request_timeout_s: float = Field(default=180.0, gt=0)
    """How long a rollout's request may wait for an answer before it fails (a hung server fails then, once)."""
    tool_call_parser: str = "hermes"
    """vLLM tool-call parser; "hermes" reads <tool_call>{json}</tool_call>, which the packaged template asks for."""
    tool_call_grammar: Literal["parameter", "function", "auto"] = "parameter"
    """How far vLLM's grammar constrains tool calls (its `--tool-strict-level`). "parameter" (agentrl's default): in
    every request with tools, for `tool_choice` "auto" too, text stays free until the model opens a call, and the
    call is then a valid one: an offered tool's name and arguments valid against its schema. On the packaged model,
    forced calls went from 0.12-0.15 of attempts with valid arguments to 31 of 32 (the other cut off by max_tokens).
    "function": the call's envelope and name only, arguments free unless a tool says `strict`. "auto" (vLLM's own
    default, the opt-out): only a required or named `tool_choice` is constrained. The trainer scores a constrained
    turn as the engine's logprobs are taken, before the grammar's mask (docs/tools.md)."""
    tool_call_max_whitespace: int | None = Field(default=1, ge=0)
    """Consecutive whitespace characters the tool-call grammar allows inside a call's JSON (1: the `{"a": 1}`
    spacing chat templates render). None: any, vLLM's own; there a model unsure of an argument can write blanks
    until `max_tokens` cuts the call off (9 of 60 held-out tool-use rollouts did, on the packaged model)."""
    replicas: int = Field(default=1, gt=0)
    """vLLM servers of the model behind the gateway. On a CPU each gets its own share of the cores; on
    GPUs each gets its own `tensor_parallel_size x data_parallel_size` devices."""
    tensor_parallel_size: int = Field(default=1, gt=0)
    """vLLM's `--tensor-parallel-size` for each replica: a model split over this many devices."""
    data_parallel_size: int = Field(default=1, gt=0)
    """vLLM's `--data-parallel-size` for each replica: copies inside one server, balanced by vLLM."""
    extra_args: tuple[str, ...] = ()
    """Further `vllm serve` arguments, passed verbatim."""
