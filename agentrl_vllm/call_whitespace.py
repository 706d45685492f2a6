"""A vLLM plugin: whitespace inside a tool call's JSON is capped, so a call under the grammar cannot run on in blanks.

vLLM's tool-call grammar (xgrammar structural tags, `--tool-strict-level`) admits any amount of whitespace
between a call's JSON tokens. A small model unsure of the next argument found that way out: on the packaged
model after RL, 9 of 60 held-out tool-use rollouts opened a call and wrote tabs and spaces until `max_tokens`
cut it off, a valid prefix every token of the way. Here every JSON part of every tool-call structural tag gets
xgrammar's `max_whitespace_cnt` (consecutive whitespace characters, where its value is unset): at 1, the
`{"a": 1, "b": 2}` spacing the chat template renders is allowed and nothing longer.

Loaded by vLLM through the `vllm.general_plugins` entry point, active where the environment sets
`AGENTRL_VLLM_CALL_WHITESPACE` to a count (agentrl's servers do, from `ServerConfig.tool_call_max_whitespace`).
"""

from __future__ import annotations

import logging
import os
from typing import Any

ENV = "AGENTRL_VLLM_CALL_WHITESPACE"
logger = logging.getLogger(__name__)


def cap_whitespace(tag: Any, limit: int) -> None:
    """Set `max_whitespace_cnt` to `limit` on every JSON-schema part of a structural tag that leaves it unset."""
    from pydantic import BaseModel
    from xgrammar.structural_tag import JSONSchemaFormat

    def visit(node: Any) -> None:
        if isinstance(node, JSONSchemaFormat) and node.max_whitespace_cnt is None:
            node.max_whitespace_cnt = limit
        if isinstance(node, BaseModel):
            for name in type(node).model_fields:
                visit(getattr(node, name))
        elif isinstance(node, (list, tuple)):
            for item in node:
                visit(item)

    visit(tag)


def _capped(build: Any, limit: int) -> Any:
    def build_capped(*args: Any, **kwargs: Any) -> Any:
        tag = build(*args, **kwargs)
        if tag is not None:
            cap_whitespace(tag, limit)
        return tag

    return build_capped


def register() -> None:
    """vLLM's plugin hook: tool-call structural tags capped at `ENV` consecutive whitespace characters."""
    value = os.environ.get(ENV)
    if not value:
        return
    try:
        from vllm.tool_parsers import structural_tag_registry
    except ImportError as error:  # another vLLM layout: its tool-call grammar keeps free whitespace
        logger.warning("agentrl: vLLM's structural tags not found (%s); tool-call whitespace stays free", error)
        return
    build = structural_tag_registry.get_model_structural_tag
    structural_tag_registry.get_model_structural_tag = _capped(build, int(value))
