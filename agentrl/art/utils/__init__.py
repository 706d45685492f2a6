"""ART's `art.utils`: dataset batches, concurrency limits, retries and small helpers, with ART's keywords."""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import agentrl
from agentrl.records.checkpoints import CheckpointStore

from .iterate_dataset import DatasetBatch, iterate_dataset
from .output_dirs import get_model_dir
from .retry import retry
from .strip_logprobs import strip_logprobs

logger = logging.getLogger(__name__)
R = TypeVar("R")

__all__ = [
    "DatasetBatch",
    "format_message",
    "get_model_step",
    "get_repo_root_path",
    "iterate_dataset",
    "limit_concurrency",
    "log_http_errors",
    "record_provenance",
    "retry",
    "strip_logprobs",
]


def limit_concurrency(
    n: int, derive_key: Callable[..., Any] | None = None
) -> Callable[[Callable[..., Awaitable[R]]], Callable[..., Awaitable[R]]]:
    """At most `n` calls of the decorated async function at once; with `derive_key(*args, **kwargs)`,
    at most `n` per key (e.g. per tool server)."""
    if derive_key is None:
        return agentrl.limit_concurrency(n)

    def decorate(function: Callable[..., Awaitable[R]]) -> Callable[..., Awaitable[R]]:
        limits: dict[Any, asyncio.Semaphore] = {}

        @functools.wraps(function)
        async def wrapper(*args: Any, **kwargs: Any) -> R:
            key = derive_key(*args, **kwargs)
            async with limits.setdefault(key, asyncio.Semaphore(n)):
                return await function(*args, **kwargs)

        return wrapper

    return decorate


def format_message(message: Any) -> str:
    """A message dict or Choice as readable text: "role: content", then its tool calls."""
    from openai.types.chat.chat_completion import Choice

    from agentrl.data.messages import choice_to_message

    data = choice_to_message(message) if isinstance(message, Choice) else dict(message)
    content = data.get("content")
    text = content if isinstance(content, str) else json.dumps(content) if content is not None else ""
    lines = [f"{data.get('role', '?')}: {text}"]
    for call in data.get("tool_calls") or []:
        function = call.get("function", {})
        lines.append(f"  tool call {function.get('name')}({function.get('arguments')})")
    return "\n".join(lines)


def get_model_step(model: agentrl.TrainableModel, art_path: str | None = None) -> int:
    """The step of the model's latest complete checkpoint on disk (0 when it has none); with `art_path`, of its run
    under that folder ({art_path}/{project}/models/{name}), as ART's."""
    run_dir = Path(model.run_dir) if art_path is None else get_model_dir(model, art_path)
    return CheckpointStore(Path(run_dir)).latest_step() or 0


def get_repo_root_path() -> str:
    """The nearest folder at or above the working directory that holds `.git`, else "." (where ART's default
    run folder, `.art`, lives)."""
    here = Path.cwd()
    return str(next((folder for folder in (here, *here.parents) if (folder / ".git").exists()), Path(".")))


def log_http_errors(function: Callable[..., Any]) -> Callable[..., Any]:
    """Log the status and body of an HTTP error (openai's or httpx's) raised by the function, then re-raise it."""

    def report(error: BaseException) -> None:
        response = getattr(error, "response", None)
        if response is not None:
            logger.error("%s: HTTP %s: %s", function.__qualname__, getattr(response, "status_code", "?"),
                         getattr(response, "text", ""))  # fmt: skip

    if inspect.iscoroutinefunction(function):

        @functools.wraps(function)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return await function(*args, **kwargs)
            except Exception as error:
                report(error)
                raise

        return async_wrapper

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except Exception as error:
            report(error)
            raise

    return wrapper


def record_provenance(run: Any, provenance: str) -> None:
    """Add `provenance` (e.g. "agentrl", "sft") to the W&B run's config["provenance"] list, once."""
    config = run.config
    current = list(config.get("provenance") or [])
    if provenance not in current:
        current.append(provenance)
        if hasattr(config, "as_dict"):  # a W&B run's config
            config.update({"provenance": current}, allow_val_change=True)
        else:
            config["provenance"] = current
