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

from agentrl.client.capture import capture_trajectory
from agentrl.data.trajectory import Trajectory
from agentrl.foundation.errors import ConfigurationError

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


_OPENAI_COMPATIBLE = {None, "openai", "openai-compatible", "openai_compatible"}
DEFAULT_INVOKE_TIMEOUT = 600.0
"""ART's outer wait for one chat-model call, in seconds."""


def init_chat_model(
    model: Any = None,
    *,
    model_provider: str | None = None,
    configurable_fields: None = None,
    config_prefix: str | None = None,
    invoke_timeout: float | None = DEFAULT_INVOKE_TIMEOUT,
    **kwargs: Any,
) -> Any:
    """A LangChain chat model for the enclosing `wrap_rollout`'s model (ART 0.5.20+'s forms):

    - no `model`: a `ChatOpenAI` at the trained model's current adapter, temperature 1.0;
    - a model-name string: the same endpoint, that name sent as `model=` instead of the served one;
    - a LangChain chat model instance: returned as it is (its calls are captured where they reach agentrl's gateway);
    - an ART model (agentrl's older form): a `ChatOpenAI` at that model, inside `wrap_rollout` or not.

    Other keywords go to ChatOpenAI (`temperature`, `max_tokens`, `timeout`, ...). `invoke_timeout` (ART's outer
    wait, 600 s; None: none) becomes ChatOpenAI's request `timeout` unless one is given: each HTTP call is bounded
    rather than the call with its retries. A provider other than OpenAI-compatible, `configurable_fields` or
    `config_prefix` raise, as in ART."""
    if configurable_fields is not None:
        raise ConfigurationError("configurable_fields is not supported by ART's init_chat_model, nor here")
    if config_prefix is not None:
        raise ConfigurationError("config_prefix is not supported by ART's init_chat_model, nor here")
    if model is not None and not isinstance(model, str) and not hasattr(model, "get_inference_name"):
        return model  # a chat model instance (ART wraps it in its logger; agentrl captures at the HTTP layer)
    if model_provider not in _OPENAI_COMPATIBLE:
        raise ConfigurationError(
            f"init_chat_model(model_provider={model_provider!r}): ART's init_chat_model builds only OpenAI-compatible "
            "chat models; pass a LangChain chat model instance as `model` for another provider"
        )
    trained = model if model is not None and not isinstance(model, str) else _model.get()
    if trained is None:
        raise ConfigurationError("init_chat_model() outside wrap_rollout(model, fn): pass the model, or call it inside")
    try:
        from langchain_openai import ChatOpenAI
    except ImportError as error:
        raise ConfigurationError(
            "art.langgraph needs LangChain's OpenAI client: pip install langchain-openai"
        ) from error
    settings: dict[str, Any] = {
        "model": model if isinstance(model, str) else trained.get_inference_name(),
        "base_url": trained.inference_base_url,
        "api_key": trained.inference_api_key,
        "temperature": 1.0,
    }
    if invoke_timeout is not None:
        settings["timeout"] = invoke_timeout
    return ChatOpenAI(**{**settings, **kwargs})
