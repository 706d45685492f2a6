"""ART's names for what agentrl does not run (Serverless, Megatron, Tinker, Unsloth): importable, so a
script's imports work, and raising on use with what to do in agentrl instead. Never a silent no-op."""

from __future__ import annotations

from typing import Any, NoReturn

from agentrl.foundation.errors import ConfigurationError, ServerError

LocalServingUnavailableError = ServerError
"""ART 0.5.20+'s error for managed inference that cannot be reached: agentrl's `ServerError` (its server failed to
start, died or refused a request), so `except art.LocalServingUnavailableError` catches agentrl's."""


class _Unsupported:
    """Constructing one raises `ConfigurationError` with the agentrl way."""

    instead = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise ConfigurationError(f"{type(self).__name__} is ART's and has no counterpart in agentrl: {self.instead}")


class ServerlessBackend(_Unsupported):
    instead = (
        "train on this machine with agentrl.art.local.LocalBackend(), or on another with "
        "agentrl.RemoteBackend(url) against `agentrl backend serve`"
    )


class MegatronTopologyConfig(_Unsupported):
    instead = "agentrl trains with torch.distributed: agentrl.LocalBackend(trainer_ranks=N, shard_trainer=True)"


class TinkerBackend(_Unsupported):
    instead = "train LoRA locally with agentrl.art.local.LocalBackend() (torch + peft)"


class UnslothBackend(_Unsupported):
    instead = "agentrl trains LoRA with torch + peft: agentrl.art.local.LocalBackend()"


def unsupported(name: str, instead: str) -> Any:
    """A function that raises, for ART functions agentrl does not have."""

    def raises(*args: Any, **kwargs: Any) -> NoReturn:
        raise ConfigurationError(f"{name} is ART's and has no counterpart in agentrl: {instead}")

    raises.__name__ = name
    return raises


class MegatronRuntimeConfig(_Unsupported):
    instead = MegatronTopologyConfig.instead


init_megatron_runtime_config = unsupported("init_megatron_runtime_config", MegatronTopologyConfig.instead)
get_megatron_runtime_config = unsupported("get_megatron_runtime_config", MegatronTopologyConfig.instead)
_TOKENIZED = (
    "agentrl keeps no tokenized or tensorized trajectory types; its trainer builds training sequences from the "
    "engine's own token ids (agentrl.rl.engine_context.tokenize_groups(groups, advantages, tokenizer))"
)
tokenize = unsupported("tokenize", _TOKENIZED)
tensorize = unsupported("tensorize", _TOKENIZED)
