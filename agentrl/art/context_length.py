"""ART 0.5.20+'s default context length: the base model's own, from its Hugging Face config, unless a model's
settings name one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import agentrl
from agentrl.foundation.base_models import resolve_base_model
from agentrl.foundation.errors import ConfigurationError


def sets_context(server: Any, internal: Any) -> bool:
    """Whether a model's settings name its context length (`server.max_model_len`, `_internal_config`'s
    `init_args.max_seq_length` or `engine_args.max_model_len`)."""
    if isinstance(server, agentrl.ServerConfig):
        given = "max_model_len" in server.model_fields_set
    else:
        given = isinstance(server, Mapping) and "max_model_len" in server
    sections = internal if isinstance(internal, Mapping) else {}
    init_args, engine_args = sections.get("init_args") or {}, sections.get("engine_args") or {}
    return given or "max_seq_length" in init_args or "max_model_len" in engine_args


_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def context_length(base_model: str) -> int:
    """The base model's context length from its Hugging Face config, as ART 0.5.20+ defaults `max_seq_length`;
    a `ConfigurationError` asking for it where the config names none."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(resolve_base_model(base_model))
    config = getattr(config, "text_config", None) or config
    for key in _CONTEXT_KEYS:
        if isinstance(value := getattr(config, key, None), int) and value > 0:
            return value
    raise ConfigurationError(
        f"the config of {base_model!r} names no context length ({', '.join(_CONTEXT_KEYS)}); give it with "
        "_internal_config={'init_args': {'max_seq_length': N}} or server=agentrl.ServerConfig(max_model_len=N)"
    )
