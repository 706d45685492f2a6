"""Rollouts as Weave ops, for users who turn Weave on; otherwise nothing is imported or sent.

Decorate a rollout with `@agentrl.traced`. Until `agentrl.enable_weave("entity/project")` is
called it is the plain function. After it, every call is a Weave op: its inputs (the model by its
served name, the scenario), the returned Trajectory with its reward and metrics, and (Weave patches
the `openai` client) each chat completion inside it, nested under the rollout.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

from pydantic import BaseModel

from agentrl.foundation.distribution import install_extra
from agentrl.foundation.errors import AgentRLError

P = ParamSpec("P")
R = TypeVar("R")
MAX_INPUT_CHARS = 4000  # an input bigger than this (a whole dataset, say) is traced by its type name

_client: Any = None


def enable_weave(project: str) -> None:
    """Start tracing `@traced` rollouts into a Weave project ("entity/project" or "project")."""
    global _client
    try:
        import weave
    except ImportError as error:
        raise AgentRLError(f"Weave tracing needs weave: {install_extra('wandb')}") from error
    _client = weave.init(project)


def disable_weave() -> None:
    """Stop tracing (pending traces are flushed first)."""
    global _client
    if _client is not None:
        import weave

        weave.finish()  # flushes the client `weave.init` made (what is still queued is sent), then stops
    _client = None


def _traceable(value: Any) -> Any:
    """What Weave records for one input: models by their served name, small data as itself."""
    from agentrl.client.model import Model

    if isinstance(value, Model):
        return value.inference_name
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    try:
        small = len(json.dumps(value, default=str)) <= MAX_INPUT_CHARS
    except (TypeError, ValueError):
        small = False
    return value if small else f"<{type(value).__name__}>"


def traced(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """Make an async rollout a Weave op while Weave is enabled; a plain call otherwise."""
    if not inspect.iscoroutinefunction(fn):
        raise TypeError(f"@agentrl.traced is for async rollout functions; {fn.__qualname__} is not async")
    op: Any = None

    @functools.wraps(fn)
    async def call(*args: P.args, **kwargs: P.kwargs) -> R:
        nonlocal op
        if _client is None:
            return await fn(*args, **kwargs)
        if op is None:
            import weave

            op = weave.op(fn, postprocess_inputs=lambda inputs: {k: _traceable(v) for k, v in inputs.items()})
        result: R = await op(*args, **kwargs)
        return result

    return call
