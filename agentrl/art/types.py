"""ART's `art.types`: message type aliases, and ART's SFT settings."""

from __future__ import annotations

from typing import Any, Literal

from openai.types.chat.chat_completion import Choice
from pydantic import BaseModel, ConfigDict, Field

import agentrl
from agentrl.foundation.errors import ConfigurationError

from .dev import LoRAConfig
from .training import TrainConfig

__all__ = [
    "LoRAConfig",
    "Message",
    "MessageOrChoice",
    "Messages",
    "MessagesAndChoices",
    "TrainConfig",
    "TrainSFTConfig",
    "Tools",
]

Message = dict[str, Any]
Messages = list[dict[str, Any]]
MessageOrChoice = dict[str, Any] | Choice
MessagesAndChoices = list[dict[str, Any] | Choice]
Tools = list[dict[str, Any]]


class TrainSFTConfig(BaseModel):
    """ART's `art.TrainSFTConfig`: one pass over the demonstrations at `learning_rate` (ART's 5e-5),
    `batch_size` of them per optimizer step ("auto": agentrl's 8), training `assistant_turns` ("all" or "last")."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    learning_rate: float = Field(default=5e-5, gt=0)
    batch_size: int | Literal["auto"] = "auto"
    assistant_turns: Literal["all", "last"] = "all"
    """ART 0.5.20+: train every assistant turn of a demonstration, or only its last."""


def sft_config(config: TrainSFTConfig | agentrl.SFTConfig | dict[str, Any] | None) -> agentrl.SFTConfig:
    """agentrl's SFTConfig for ART's (or agentrl's own, passed through)."""
    if isinstance(config, agentrl.SFTConfig):
        return config
    art = TrainSFTConfig.model_validate(config or {})
    if isinstance(art.learning_rate, list):
        raise ConfigurationError("a learning-rate schedule (a list) is not supported: give one learning_rate")
    return agentrl.SFTConfig(
        learning_rate=art.learning_rate,
        epochs=1,
        batch_size=8 if art.batch_size == "auto" else art.batch_size,
        assistant_turns=art.assistant_turns,
    )
