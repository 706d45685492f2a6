"""ART's names for what agentrl does not run (Serverless, Megatron, Tinker, Unsloth): importable, so a
script's imports work, and raising on use with what to do in agentrl instead. Never a silent no-op."""

from __future__ import annotations

from typing import Any, NoReturn

from agentrl.errors import ConfigurationError


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
