"""A vLLM plugin: a tool call its parser cannot read is one warning line in the server's log, not a traceback.

vLLM's tool parsers log `logger.exception(...)` for every reply whose call text they cannot parse (a small
model's malformed JSON, a call cut off by `max_tokens`), so logs/vllm.log filled with tracebacks that say nothing
the reply itself does not. The reply still comes back as text without `tool_calls`; agentrl counts it in the
step's `tool_call_parse_failures` and marks it in the step's transcript (agentrl.data.tool_calls). Here each such
record keeps its message and the exception's one-line summary, as a warning without the traceback.

Loaded by vLLM through the `vllm.general_plugins` entry point, active where the environment sets
`AGENTRL_VLLM_QUIET_TOOL_PARSERS=1` (agentrl's servers do).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

ENV = "AGENTRL_VLLM_QUIET_TOOL_PARSERS"
PARSERS_PACKAGE = "vllm.tool_parsers"


class OneLine(logging.Filter):
    """An error record with a traceback becomes a warning of one line: its message and the exception's."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None and record.levelno >= logging.ERROR:
            error = record.exc_info[1]
            summary = f"{type(error).__name__}: {error}".replace("\n", " ")[:200]
            record.msg, record.args = f"{record.getMessage()} (returned as text) {summary}", ()
            record.exc_info, record.exc_text, record.stack_info = None, None, None
            record.levelno, record.levelname = logging.WARNING, logging.getLevelName(logging.WARNING)
        return True


def parser_logger_names() -> list[str]:
    """The loggers of every tool parser vLLM ships (named by module, so they exist before a parser loads)."""
    import vllm.tool_parsers

    folder = Path(vllm.tool_parsers.__file__).parent
    return [f"{PARSERS_PACKAGE}.{path.stem}" for path in sorted(folder.glob("*.py")) if path.stem != "__init__"]


def register() -> None:
    """vLLM's plugin hook: one line per unparsable tool call where `ENV` is 1."""
    if os.environ.get(ENV) != "1":
        return
    try:
        names = parser_logger_names()
    except ImportError:  # a vLLM without this package: its parsers keep their tracebacks
        return
    one_line = OneLine()
    for name in names:
        logging.getLogger(name).addFilter(one_line)
