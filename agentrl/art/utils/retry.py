"""ART's `retry` decorator, for sync and async functions alike."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from agentrl.foundation.errors import ConfigurationError

logger = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Any])


def retry(  # noqa: C901 - over the limit when the rule came on; split it when next changed
    max_attempts: int = 3,
    delay: float = 0.25,
    backoff_factor: float = 2.0,
    exceptions: tuple[type[BaseException], ...] = (Exception,),
    on_retry: Callable[[BaseException, int], Any] | None = None,
) -> Callable[[F], F]:
    """Call the function up to `max_attempts` times while it raises one of `exceptions`, waiting `delay`
    seconds, then `delay * backoff_factor`, ... (a factor below 1 shortens the waits, as ART's does); `on_retry(error, attempt)` runs before each wait (awaited
    when it is async). The last error is raised as it was."""
    if max_attempts < 1 or delay < 0 or backoff_factor < 0:
        raise ConfigurationError("retry needs max_attempts >= 1, delay >= 0 and backoff_factor >= 0")

    def waits() -> list[float]:
        return [delay * backoff_factor**i for i in range(max_attempts - 1)]

    def decorate(function: F) -> F:  # noqa: C901 - over the limit when the rule came on; split it when next changed
        if inspect.iscoroutinefunction(function):

            @functools.wraps(function)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                for attempt, wait in enumerate([*waits(), None], start=1):
                    try:
                        return await function(*args, **kwargs)
                    except exceptions as error:
                        if wait is None:
                            raise
                        logger.warning(
                            "%s failed (attempt %d of %d): %r", function.__qualname__, attempt, max_attempts, error
                        )
                        if on_retry is not None and inspect.isawaitable(outcome := on_retry(error, attempt)):
                            await outcome
                        await asyncio.sleep(wait)
                raise AssertionError("unreachable")

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            for attempt, wait in enumerate([*waits(), None], start=1):
                try:
                    return function(*args, **kwargs)
                except exceptions as error:
                    if wait is None:
                        raise
                    logger.warning(
                        "%s failed (attempt %d of %d): %r", function.__qualname__, attempt, max_attempts, error
                    )
                    if on_retry is not None:
                        on_retry(error, attempt)
                    time.sleep(wait)
            raise AssertionError("unreachable")

        return wrapper  # type: ignore[return-value]

    return decorate
