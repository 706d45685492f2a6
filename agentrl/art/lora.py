"""ART's LoRA settings and agentrl's: 0.5.18's `LoRAConfig` dict (rank, alpha, dropout, target_modules, ...) and
the peft names older scripts use, to `agentrl.LoRAConfig` and back; a key agentrl cannot honour raises by name."""

from __future__ import annotations

from typing import Any

import agentrl
from agentrl.foundation.errors import ConfigurationError

LORA_NAMES = {"rank": "rank", "r": "rank", "alpha": "alpha", "lora_alpha": "alpha", "dropout": "dropout",
              "lora_dropout": "dropout", "target_modules": "target_modules"}  # fmt: skip
"""ART's LoRA keys (0.5.18's, and peft's that older scripts use) -> `agentrl.LoRAConfig`'s."""
LORA_COMPUTE_ONLY = ("use_gradient_checkpointing", "random_state", "temporary_location", "max_seq_length")
"""ART's LoRA keys that change how its trainer computes (memory, seeding, scratch files), not the adapter trained."""
LORA_DEFAULTS: dict[str, Any] = {"bias": "none", "layers_to_transform": None, "layers_pattern": None,
                                 "use_rslora": False, "modules_to_save": None, "init_weights": True, "loftq_config": None}  # fmt: skip
"""ART's LoRA keys agentrl has no counterpart of: only their default is accepted."""


def lora_from_art(lora_config: Any) -> agentrl.LoRAConfig:
    """ART's `LoRAConfig` dict (rank, alpha, dropout, target_modules, ...; or older scripts' peft names) as agentrl's."""
    if isinstance(lora_config, agentrl.LoRAConfig):
        return lora_config
    data = lora_config.model_dump() if hasattr(lora_config, "model_dump") else dict(lora_config)
    unknown = sorted(set(data) - set(LORA_NAMES) - set(LORA_COMPUTE_ONLY) - set(LORA_DEFAULTS))
    if unknown:
        raise ConfigurationError(f"lora_config keys {unknown} are not ART's LoRAConfig keys")
    for key, default in LORA_DEFAULTS.items():
        if key in data and data[key] not in (default, {} if key == "loftq_config" else default):
            raise ConfigurationError(
                f"lora_config {key}={data[key]!r} has no counterpart in agentrl.LoRAConfig (only ART's default "
                f"{default!r} is accepted): agentrl trains a plain LoRA on rank, alpha, dropout and target_modules"
            )
    mapped = {LORA_NAMES[k]: v for k, v in data.items() if k in LORA_NAMES and v is not None}
    if "target_modules" in mapped:
        mapped["target_modules"] = tuple(mapped["target_modules"])
    return agentrl.LoRAConfig(**mapped)


def lora_as_art(lora: agentrl.LoRAConfig) -> dict[str, Any]:
    """agentrl's LoRA settings as ART's `LoRAConfig` dict."""
    return {
        "rank": lora.rank,
        "alpha": lora.alpha,
        "dropout": lora.dropout,
        "target_modules": list(lora.target_modules),
    }
