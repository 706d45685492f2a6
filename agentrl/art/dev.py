"""ART's `art.dev`: its advanced settings as TypedDicts, and what agentrl makes of them.

`TrainConfig` holds the training keys of `agentrl.art.training` (mapped, or refused by name there).
`InternalModelConfig` (init_args, engine_args, peft_args, ...) becomes `LoRAConfig`/`ServerConfig`
fields for the keys agentrl has (`internal_config_settings`); any other key raises, naming itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypedDict

import agentrl
from agentrl.foundation.errors import ConfigurationError


class TrainConfig(TypedDict, total=False):
    """ART's advanced training keys (`model.train(..., _config=...)`); see `agentrl.art.training`."""

    ppo: bool
    loss_fn: Literal["cispo", "ppo"]
    loss_fn_config: dict[str, Any] | None
    epsilon: float | None
    epsilon_high: float | None
    importance_sampling_level: Literal["token", "sequence", "average", "geometric_average"]
    scale_rewards: bool
    normalize_advantages: bool
    kl_penalty_coef: float
    kl_penalty_source: Literal["current_learner", "sample"]
    kl_penalty_reference_step: int | None
    kl_ref_adapter_path: str | None
    adam_params: dict[str, Any] | None
    advantage_balance: float
    max_negative_advantage_importance_sampling_weight: float | None
    mask_prob_ratio: bool
    kimi_k2_tau: float | None
    precalculate_logprobs: bool
    allow_training_without_logprobs: bool
    plot_tensors: bool
    truncated_importance_sampling: float | None
    scale_learning_rate_by_reward_std_dev: bool
    logprob_calculation_chunk_size: int
    packed_sequence_length: int | None
    num_trajectories_learning_rate_multiplier_power: float
    grad_accumulation_sequences: int | None
    optimizer_save_interval: int
    final_training_step: int | None


class InitArgs(TypedDict, total=False):
    """How ART loads the model; agentrl uses `max_seq_length` (its server's `max_model_len`)."""

    model_name: str
    max_seq_length: int
    load_in_4bit: bool
    load_in_8bit: bool
    load_in_16bit: bool
    fast_inference: bool


class EngineArgs(TypedDict, total=False):
    """vLLM engine arguments; agentrl uses gpu_memory_utilization, tensor_parallel_size, max_model_len,
    enable_sleep_mode (True: agentrl's server sleeps while a step trains on its device)."""

    gpu_memory_utilization: float
    tensor_parallel_size: int
    max_model_len: int
    enable_sleep_mode: bool
    max_num_seqs: int
    enforce_eager: bool


class PeftArgs(TypedDict, total=False):
    """LoRA settings: r, lora_alpha, target_modules and lora_dropout become `agentrl.LoRAConfig`."""

    r: int
    lora_alpha: int
    target_modules: list[str]
    lora_dropout: float


class TrainerArgs(TypedDict, total=False):
    """Hugging Face TrainingArguments in ART; agentrl's trainer has its own (`agentrl.TrainConfig`)."""

    learning_rate: float
    gradient_accumulation_steps: int
    max_grad_norm: float


class LoRAConfig(TypedDict, total=False):
    """ART 0.5.18's `art.LoRAConfig` / `art.dev.LoRAConfig` (a plain dict): rank, alpha, dropout and target_modules
    become `agentrl.LoRAConfig`; the rest are accepted at ART's defaults (or where they change only how ART's trainer
    computes), and otherwise raise naming the key (`art.models.lora_from_art`). Older scripts' peft names (r,
    lora_alpha, lora_dropout) are read too."""

    rank: int
    target_modules: list[str]
    alpha: int
    dropout: float
    bias: str
    layers_to_transform: list[int] | None
    layers_pattern: str | None
    use_gradient_checkpointing: str
    random_state: int
    max_seq_length: int
    use_rslora: bool
    modules_to_save: list[str] | None
    init_weights: bool
    loftq_config: dict[str, Any]
    temporary_location: str


class TrainSFTConfig(TypedDict, total=False):
    learning_rate: float
    batch_size: int


class ServerArgs(TypedDict, total=False):
    api_key: str
    host: str
    port: int


class OpenAIServerConfig(TypedDict, total=False):
    log_file: str
    server_args: ServerArgs
    engine_args: EngineArgs


class TinkerArgs(TypedDict, total=False):
    """ART's Tinker settings: agentrl has no Tinker backend (see `agentrl.art.TinkerBackend`)."""

    renderer_name: str


class TinkerTrainingClientArgs(TypedDict, total=False):
    rank: int


class TinkerNativeArgs(TypedDict, total=False):
    """ART's native-Tinker settings: a plain dict here too; agentrl has no Tinker backend."""

    renderer_name: str
    training_client_args: TinkerTrainingClientArgs


RolloutWeightUpdateMode = Literal["step_lora", "in_flight_lora"]
"""ART 0.5.20+: when served weights change; agentrl swaps the adapter after each step ("step_lora")."""


class VllmRuntimeArgs(TypedDict, total=False):
    """ART 0.5.20+'s vLLM runtime: agentrl runs "managed" only (it starts and stops its own server)."""

    mode: Literal["managed", "external"]
    server_url: str
    api_key: str | None
    local_checkpoint_root: str | None
    server_checkpoint_root: str | None
    health_timeout_s: float


def is_external_vllm_mode(config: Mapping[str, Any]) -> bool:
    """Whether ART's config asks for an external vLLM server (`vllm_runtime.mode == "external"`)."""
    runtime = config.get("vllm_runtime") or {}
    return bool(isinstance(runtime, Mapping) and runtime.get("mode") == "external")


class InternalModelConfig(TypedDict, total=False):
    init_args: InitArgs
    engine_args: EngineArgs
    peft_args: PeftArgs
    trainer_args: TrainerArgs
    tinker_args: TinkerArgs
    tinker_training_client_args: TinkerTrainingClientArgs
    dedicated: bool
    rollout_weight_update_mode: RolloutWeightUpdateMode
    vllm_runtime: VllmRuntimeArgs
    megatron_model_initialization: Literal["pretrained", "random"]


class BackendModelConfig(InternalModelConfig, total=False):
    """ART's per-model backend settings (`InternalModelConfig` plus `lora_config`), a plain dict. Given as a model's
    `_internal_config`, its `lora_config` key is refused by name: give `TrainableModel(lora_config=...)`."""

    lora_config: LoRAConfig


_SERVER_KEYS = {"max_seq_length": "max_model_len", "max_model_len": "max_model_len",
                "gpu_memory_utilization": "gpu_memory_utilization", "tensor_parallel_size": "tensor_parallel_size"}  # fmt: skip
_LORA_KEYS = {"r": "rank", "lora_alpha": "alpha", "target_modules": "target_modules", "lora_dropout": "dropout"}
_ACCEPTED = {"model_name", "enable_sleep_mode"}  # model_name: the base model is `base_model`
# Keys accepted at these values only: how ART's Unsloth loads the base (agentrl's base is 16-bit, float32 on a CPU
# without bf16), ART 0.5.20+'s default adapter update and managed vLLM (agentrl swaps the adapter after each step).
_ACCEPTED_AT = {
    "load_in_4bit": (False,), "load_in_8bit": (False,), "load_in_16bit": (True,),
    "rollout_weight_update_mode": ("step_lora",), "megatron_model_initialization": (None, "pretrained"),
}  # fmt: skip
_ENGINE_FLAGS = {"max_num_seqs": "--max-num-seqs", "enforce_eager": "--enforce-eager"}
"""vLLM engine arguments passed to `vllm serve` as they are (ServerConfig.extra_args)."""


def internal_config_settings(  # noqa: C901 - over the limit when the rule came on; split it when next changed
    internal: Mapping[str, Any], *, lora: Any = None, server: Any = None
) -> dict[str, agentrl.LoRAConfig | agentrl.ServerConfig]:
    """`lora` and `server` (given, or agentrl's defaults) updated from ART's `InternalModelConfig`;
    `ConfigurationError` naming any key agentrl has no counterpart for."""
    server_update: dict[str, Any] = {}
    lora_update: dict[str, Any] = {}
    engine_flags: list[str] = []
    refused: list[str] = []
    for section, values in dict(internal).items():
        if section in _ACCEPTED_AT:
            if values not in _ACCEPTED_AT[section]:
                refused.append(f"{section}={values!r} (accepted: {_ACCEPTED_AT[section]})")
            continue
        if section == "vllm_runtime":
            mode = values.get("mode", "managed") if isinstance(values, Mapping) else getattr(values, "mode", "managed")
            if mode != "managed":
                refused.append(f"vllm_runtime.mode={mode!r} (agentrl starts and manages its own vLLM)")
            continue
        if section not in ("init_args", "engine_args", "peft_args") or not isinstance(values, Mapping):
            if values:
                refused.append(section)
            continue
        for key, value in values.items():
            where = f"{section}.{key}"
            if key in _ACCEPTED_AT:
                if value not in _ACCEPTED_AT[key]:
                    refused.append(f"{where}={value!r} (accepted: {_ACCEPTED_AT[key]})")
            elif section == "engine_args" and key in _ENGINE_FLAGS:
                if key == "enforce_eager":
                    engine_flags += [_ENGINE_FLAGS[key]] if value else []
                else:
                    engine_flags += [_ENGINE_FLAGS[key], str(int(value))]
            elif key == "enable_sleep_mode" and value is False:
                refused.append(f"{where}=False (agentrl's server sleeps while a step trains on its device)")
            elif section == "peft_args" and key in _LORA_KEYS:
                lora_update[_LORA_KEYS[key]] = tuple(value) if key == "target_modules" else value
            elif section != "peft_args" and key in _SERVER_KEYS:
                server_update[_SERVER_KEYS[key]] = value
            elif key not in _ACCEPTED:
                refused.append(where)
    if refused:
        raise ConfigurationError(
            f"_internal_config {refused} has no counterpart in agentrl: it takes init_args.max_seq_length, "
            "init_args.{load_in_4bit=False, load_in_16bit=True}, engine_args.{gpu_memory_utilization, "
            "tensor_parallel_size, max_model_len, max_num_seqs, enforce_eager, enable_sleep_mode}, "
            "peft_args.{r, lora_alpha, target_modules, lora_dropout}, rollout_weight_update_mode='step_lora' and "
            "vllm_runtime in 'managed' mode; set other server settings with "
            "TrainableModel(server=agentrl.ServerConfig(...))"
        )
    settings: dict[str, agentrl.LoRAConfig | agentrl.ServerConfig] = {}
    if lora_update:
        settings["lora"] = _updated(agentrl.LoRAConfig, lora, lora_update)
    if engine_flags:
        current = (
            server.extra_args if isinstance(server, agentrl.ServerConfig) else (server or {}).get("extra_args", ())
        )
        server_update["extra_args"] = (*current, *engine_flags)
    if server_update:
        settings["server"] = _updated(agentrl.ServerConfig, server, server_update)
    return settings


def _updated(cls: Any, current: Any, update: dict[str, Any]) -> Any:
    data = current.model_dump() if hasattr(current, "model_dump") else dict(current or {})
    return cls.model_validate({**data, **update})


def get_openai_server_config(*args: Any, **kwargs: Any) -> OpenAIServerConfig:
    """ART builds its vLLM server's settings here; agentrl's come from `agentrl.ServerConfig`."""
    raise ConfigurationError(
        "art.dev.get_openai_server_config has no counterpart: agentrl starts vLLM from TrainableModel(server="
        "agentrl.ServerConfig(...)); pass engine settings through _internal_config's engine_args"
    )


def is_dedicated_mode(config: Mapping[str, Any]) -> bool:
    """Whether ART's config asks for dedicated trainer/inference GPUs (`dedicated`, or ART 0.5.20+'s external vLLM)."""
    return bool(config.get("dedicated")) or is_external_vllm_mode(config)


def validate_dedicated_config(config: Mapping[str, Any]) -> None:
    """agentrl's dedicated mode is `LocalBackend(trainer_device="cuda:1")`, not a model setting."""
    if is_dedicated_mode(config):
        raise ConfigurationError(
            "dedicated mode is LocalBackend(trainer_device='cuda:1') in agentrl: the trainer on its own GPU"
        )


__all__ = [
    "BackendModelConfig",
    "EngineArgs",
    "InitArgs",
    "InternalModelConfig",
    "LoRAConfig",
    "OpenAIServerConfig",
    "PeftArgs",
    "ServerArgs",
    "TinkerArgs",
    "TinkerNativeArgs",
    "TinkerTrainingClientArgs",
    "TrainConfig",
    "TrainSFTConfig",
    "TrainerArgs",
    "RolloutWeightUpdateMode",
    "VllmRuntimeArgs",
    "get_openai_server_config",
    "is_dedicated_mode",
    "is_external_vllm_mode",
    "validate_dedicated_config",
]
