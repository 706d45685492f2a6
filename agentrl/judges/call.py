"""One structured judge call through litellm, validated, retried a bounded number of times.

Both judges ask for JSON that matches a pydantic model's schema. Where the judge is served by vLLM,
`response_format` with a JSON schema makes the output parse by construction (constrained decoding);
any other provider that honours it gets the same. Whatever comes back is still validated, and an
answer that fails validation is retried like a failed request, up to `max_attempts`; then
`JudgeError`. No default answer is ever substituted.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from agentrl.client.model import JudgeModel
from agentrl.foundation.errors import ConfigurationError, JudgeError
from agentrl.foundation.litellm_loader import load_litellm

logger = logging.getLogger(__name__)
AnswerT = TypeVar("AnswerT", bound=BaseModel)
# Between attempts: 0.5 s, 1 s, 2 s ... up to 8 s, room for a rate-limited or restarting API to recover.
RETRY_WAIT = wait_exponential(multiplier=0.5, max=8)


class InvalidJudgeAnswer(ValueError):
    """The judge answered, but not with something usable (malformed JSON, wrong ids, bad scores)."""


@dataclass
class JudgeLimiter:
    """Caps concurrent judge calls (shared by every group judged with it) and counts what happened.

    Judges use `DEFAULT_LIMITER` unless given one, so by default all judge calls of a process
    share one cap of 8.
    """

    max_concurrent: int = 8
    calls: int = 0
    attempts: int = 0
    failures: int = 0
    latencies_s: list[float] = field(default_factory=list)
    _semaphores: dict[int, asyncio.Semaphore] = field(default_factory=dict, repr=False)

    def semaphore(self) -> asyncio.Semaphore:
        # One per event loop: a semaphore is bound to the loop it first waits in.
        return self._semaphores.setdefault(id(asyncio.get_running_loop()), asyncio.Semaphore(self.max_concurrent))


DEFAULT_LIMITER = JudgeLimiter()


@dataclass(frozen=True)
class JudgeCall:
    """A validated answer and what it cost, summed over its attempts."""

    answer: Any
    attempts: int
    latency_s: float
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = None
    """From litellm's price map; None where the model has no price (a local server)."""


def _usage(response: Any) -> tuple[int, int]:
    usage = getattr(response, "usage", None)
    return (getattr(usage, "prompt_tokens", 0) or 0, getattr(usage, "completion_tokens", 0) or 0)


def _price(response: Any) -> float | None:
    try:
        return float(load_litellm().completion_cost(completion_response=response))
    except Exception:  # noqa: BLE001  litellm raises a bare Exception for a model missing from its price map
        return None


def litellm_params(judge_model: JudgeModel) -> dict[str, Any]:
    return {"model": judge_model} if isinstance(judge_model, str) else judge_model.litellm_params()


# Judges served locally (vLLM, Ollama) are often small; decoding greedily they can loop inside an
# explanation until max_tokens and never close the JSON (seen here with the 135M model), and sampling
# a list they can keep adding items until max_tokens (a task writer on a float32 CPU then spends its
# whole timeout on one answer) or close it empty (the 135M writer did so three attempts running in CI).
# Their constrained decoders honour maxLength, minItems and maxItems, so strings and lists are bounded
# for them. Hosted strict modes may reject these, so none goes to other providers.
LOCAL_ROUTES = ("hosted_vllm/", "ollama/", "ollama_chat/")
MAX_TEXT_CHARS = 160
"""A sentence of explanation. A small model can spend a token per character, so this bounds a
rubric judge's answer on 5 rubrics to about 1,000 tokens (at 300 it ran past its max_tokens, float32 EPYC)."""
RETRY_TEMPERATURE = 0.7
"""A greedy judge that gave an unusable answer would give the same one again: its retries sample."""


SAMPLING_PARAMS = ("temperature", "top_p", "presence_penalty", "frequency_penalty", "seed", "logprobs", "top_logprobs")
"""Parameters a provider may refuse for a model (litellm checks them before it sends anything)."""


@functools.lru_cache(maxsize=512)
def litellm_refusal(model: str, param: str, value: Any) -> str | None:
    """Why litellm would refuse `param=value` for `model` before sending the request (an o-series or GPT-5 model
    takes only its default temperature), from its own parameter check: no request is made. None: it takes it."""
    litellm = load_litellm()
    try:
        name, provider, _, _ = litellm.get_llm_provider(model)
        litellm.get_optional_params(model=name, custom_llm_provider=provider, **{param: value})
    except litellm.exceptions.UnsupportedParamsError as error:
        return str(error)
    except Exception:  # noqa: BLE001 - a provider litellm cannot place: the call itself will say so
        return None
    return None


def judge_sampling(model: str) -> dict[str, Any]:
    """Greedy decoding (temperature 0, retries at `RETRY_TEMPERATURE`) where the model takes it; nothing where it
    takes only its default temperature (ART sends none: o3, o4-mini, GPT-5), so the judge samples as it must."""
    if litellm_refusal(model, "temperature", 0.0) or litellm_refusal(model, "temperature", RETRY_TEMPERATURE):
        if model not in _SAMPLED_JUDGES:
            _SAMPLED_JUDGES.add(model)
            logger.info("judge %s takes only its default temperature: its judgements are sampled at it", model)
        return {}
    return {"temperature": 0.0}


_SAMPLED_JUDGES: set[str] = set()


def checked_extra_params(model: str, extra: dict[str, Any]) -> dict[str, Any]:
    """`extra` (a caller's `extra_litellm_params`), or a ConfigurationError naming a sampling parameter the model
    refuses, before any call: a judge that refuses every call would otherwise leave every group unscored."""
    for param in SAMPLING_PARAMS:
        if param in extra and (why := litellm_refusal(model, param, extra[param])) is not None:
            raise ConfigurationError(
                f"judge {model} does not take {param}={extra[param]!r} (litellm: {why.splitlines()[0]}): leave "
                f"{param} out of extra_litellm_params"
            )
    return extra


def _bound_lengths(node: Any, max_items: int | None) -> None:
    if isinstance(node, dict):
        if node.get("type") == "string" and "enum" not in node:
            node["maxLength"] = MAX_TEXT_CHARS
        if node.get("type") == "array" and max_items is not None:
            node["maxItems"] = min(node.get("maxItems", max_items), max_items)
            node["minItems"] = max(node.get("minItems", 1), 1)
        for value in node.values():
            _bound_lengths(value, max_items)
    elif isinstance(node, list):
        for value in node:
            _bound_lengths(value, max_items)


def response_format(
    schema_model: type[BaseModel], *, bound_lengths: bool = False, max_items: int | None = None
) -> dict[str, Any]:
    """The JSON-schema `response_format` for `schema_model`; with `bound_lengths` (local judges only),
    strings get `maxLength` and, given `max_items`, lists hold 1 to `max_items` items."""
    schema = schema_model.model_json_schema()
    if bound_lengths:
        _bound_lengths(schema, max_items)
    return {"type": "json_schema", "json_schema": {"name": schema_model.__name__, "schema": schema, "strict": True}}


def _content_of(response: Any) -> str:
    content = response.choices[0].message.content
    if not isinstance(content, str) or not content:
        raise InvalidJudgeAnswer("the judge returned an empty message")
    return content


def parse_json_object(text: str) -> Any:
    """JSON from a judge's text; tolerates a ```json fence around it, nothing else."""
    stripped = text.strip()
    if stripped.startswith("```"):
        stripped = stripped.split("\n", 1)[1] if "\n" in stripped else ""
        stripped = stripped.rsplit("```", 1)[0]
    try:
        return json.loads(stripped)
    except json.JSONDecodeError as error:
        raise InvalidJudgeAnswer(f"the judge's answer is not valid JSON ({error.msg}): {text[:200]!r}") from error


async def structured_judge_call(
    judge_model: JudgeModel,
    messages: list[dict[str, Any]],
    schema_model: type[AnswerT],
    validate: Callable[[AnswerT], Any],
    *,
    limiter: JudgeLimiter | None = None,
    max_attempts: int = 3,
    timeout_s: float = 120.0,
    extra_litellm_params: dict[str, Any] | None = None,
    max_items: int | None = None,
) -> JudgeCall:
    """Ask, parse into `schema_model`, `validate` (which may repair or raise InvalidJudgeAnswer); retry.
    `max_items` bounds every list in a local judge's answer to 1..max_items items (see `LOCAL_ROUTES`)."""
    route = litellm_params(judge_model)
    local = route["model"].startswith(LOCAL_ROUTES)
    params = {
        **route,
        "messages": messages,
        "response_format": response_format(schema_model, bound_lengths=local, max_items=max_items),
        "timeout": timeout_s,
        **judge_sampling(route["model"]),
        "max_retries": 0,  # retries are ours alone: bounded, and counted in the limiter
        **checked_extra_params(route["model"], extra_litellm_params or {}),
    }

    def read(response: Any) -> Any:
        try:
            return validate(schema_model.model_validate(parse_json_object(_content_of(response))))
        except ValidationError as error:
            raise InvalidJudgeAnswer(f"the judge's answer does not match the schema: {error}") from error

    return await retried_judge_call(params, read, limiter=limiter, max_attempts=max_attempts)


async def retried_judge_call(
    params: dict[str, Any],
    read: Callable[[Any], Any],
    *,
    limiter: JudgeLimiter | None = None,
    max_attempts: int = 3,
    give_up_on: tuple[type[Exception], ...] = (),
) -> JudgeCall:
    """`litellm.acompletion(**params)`, its response turned into an answer by `read` (which raises
    InvalidJudgeAnswer for an unusable one), retried a bounded number of times under `limiter`; a greedy
    judge's retry after an unusable answer samples. `give_up_on`: exceptions of `read` passed to the
    caller as they are, at once (not a judge failure). Anything else left after the retries: JudgeError."""
    local = params["model"].startswith(LOCAL_ROUTES)  # unpriced: asking litellm's price map only prints its errors
    limiter = limiter or DEFAULT_LIMITER
    limiter.calls += 1
    started = time.perf_counter()
    attempts = prompt_tokens = completion_tokens = 0
    last_invalid = False
    cost_usd: float | None = None
    litellm = load_litellm()
    try:
        async with limiter.semaphore():
            async for attempt in AsyncRetrying(
                stop=stop_after_attempt(max_attempts),
                wait=RETRY_WAIT,
                retry=retry_if_exception_type(
                    (
                        InvalidJudgeAnswer,
                        litellm.exceptions.APIError,
                        litellm.exceptions.Timeout,
                        litellm.exceptions.APIConnectionError,
                        litellm.exceptions.RateLimitError,
                        litellm.exceptions.InternalServerError,
                        litellm.exceptions.ServiceUnavailableError,
                    )
                ),
                reraise=True,
            ):
                with attempt:
                    attempts += 1
                    limiter.attempts += 1
                    if attempts > 1 and last_invalid and params.get("temperature") == 0.0:
                        params["temperature"] = RETRY_TEMPERATURE
                    last_invalid = False
                    response = await litellm.acompletion(**params)
                    tokens_in, tokens_out = _usage(response)
                    prompt_tokens, completion_tokens = prompt_tokens + tokens_in, completion_tokens + tokens_out
                    if not local and (price := _price(response)) is not None:
                        cost_usd = (cost_usd or 0.0) + price
                    try:
                        answer = read(response)
                    except InvalidJudgeAnswer:
                        last_invalid = True
                        raise
    except give_up_on:
        raise
    except Exception as error:
        limiter.failures += 1
        raise JudgeError(
            f"judge {params['model']} gave no valid answer in {attempts} attempt(s): {type(error).__name__}: {error}"
        ) from error
    latency = time.perf_counter() - started
    limiter.latencies_s.append(latency)
    return JudgeCall(answer, attempts, latency, prompt_tokens, completion_tokens, cost_usd)
