"""Decorators for the async functions a rollout calls: `retry` (tenacity underneath) for flaky calls,
and `limit_concurrency` (an asyncio semaphore) for tools or APIs that take only so many calls at once."""

from __future__ import annotations

import asyncio
import functools
import logging
import weakref
from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar

from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from agentrl.foundation.errors import ConfigurationError

P = ParamSpec("P")
R = TypeVar("R")
logger = logging.getLogger(__name__)


def retry(
    max_attempts: int = 3,
    *,
    exceptions: tuple[type[BaseException], ...] = (Exception,),
    min_wait_s: float = 0.5,
    max_wait_s: float = 10.0,
) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
    """Call the decorated async function up to `max_attempts` times while it raises one of `exceptions`,
    waiting exponentially longer between attempts; the last error is raised as it was."""
    if max_attempts < 1:
        raise ConfigurationError(f"retry needs max_attempts >= 1, got {max_attempts}")

    def decorate(function: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        @functools.wraps(function)
        async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            async for attempt in AsyncRetrying(
                stop=stop_after_attempt(max_attempts),
                wait=wait_exponential(min=min_wait_s, max=max_wait_s),
                retry=retry_if_exception_type(exceptions),
                reraise=True,
                before_sleep=lambda state: logger.warning(
                    "%s failed (attempt %d of %d): %r; retrying",
                    function.__qualname__,
                    state.attempt_number,
                    max_attempts,
                    state.outcome.exception() if state.outcome else None,
                ),
            ):
                with attempt:
                    return await function(*args, **kwargs)
            raise AssertionError("unreachable: tenacity re-raises the last error")

        return wrapper

    return decorate


def limit_concurrency(limit: int) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
    """At most `limit` calls of the decorated async function run at once (per event loop); others wait."""
    if limit < 1:
        raise ConfigurationError(f"limit_concurrency needs a limit >= 1, got {limit}")

    def decorate(function: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        semaphores: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )

        @functools.wraps(function)
        async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            loop = asyncio.get_running_loop()
            semaphore = semaphores.setdefault(loop, asyncio.Semaphore(limit))
            async with semaphore:
                return await function(*args, **kwargs)

        return wrapper

    return decorate
