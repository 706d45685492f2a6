"""ART's `art.langgraph`: a LangGraph agent's calls become the trajectory.

`wrap_rollout(model, fn)` runs `fn` with every completion it makes through agentrl's gateway
recorded (`agentrl.capture_trajectory`); inside it, `init_chat_model()` is a LangChain chat model
pointed at the model being trained (temperature 1.0), so the graph needs no other change.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Awaitable, Callable
from typing import Any

from agentrl.capture import capture_trajectory
from agentrl.errors import ConfigurationError
from agentrl.trajectory import Trajectory

_model: contextvars.ContextVar[Any] = contextvars.ContextVar("agentrl_art_langgraph_model", default=None)


def wrap_rollout(model: Any, fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Trajectory]]:
    """`fn` as a rollout of `model`: its gateway completions are the trajectory's conversation. When `fn`
    returns a Trajectory with no sampled turn of its own, it gets them (its reward, metrics and metadata
    kept); a number it returns is the reward."""

    @functools.wraps(fn)
    async def rollout(*args: Any, **kwargs: Any) -> Trajectory:
        token = _model.set(model)
        try:
            with capture_trajectory(model=model) as captured:
                result = await fn(*args, **kwargs)
        finally:
            _model.reset(token)
        if isinstance(result, Trajectory):
            if not any(h.choices() for h in result.histories()):
                result.messages_and_choices = captured.messages_and_choices
                result.additional_histories = captured.additional_histories
                result.tools = result.tools or captured.tools
            return result.finish()
        if isinstance(result, (int, float)) and not isinstance(result, bool):
            captured.reward = float(result)
        return captured.finish()

    return rollout


def init_chat_model(model: Any = None, *, temperature: float = 1.0, **kwargs: Any) -> Any:
    """A `langchain_openai.ChatOpenAI` for the model of the enclosing `wrap_rollout` (or `model`), at its
    current adapter; keywords go to ChatOpenAI (max_tokens, timeout, ...)."""
    trained = model if model is not None and not isinstance(model, str) else _model.get()
    if trained is None:
        raise ConfigurationError("init_chat_model() outside wrap_rollout(model, fn): pass the model, or call it inside")
    try:
        from langchain_openai import ChatOpenAI
    except ImportError as error:
        raise ConfigurationError(
            "art.langgraph needs LangChain's OpenAI client: pip install langchain-openai"
        ) from error
    return ChatOpenAI(
        model=trained.get_inference_name(),
        base_url=trained.inference_base_url,
        api_key=trained.inference_api_key,
        temperature=temperature,
        **kwargs,
    )
