"""A judge's decision read from its next-token probabilities instead of sampled JSON.

The judge is asked a question with a fixed set of one-token answers ("A" or "B", "Yes" or "No") and
answers with one token (`max_tokens=1`) and its `top_logprobs`; the decision is the probability of
each answer among the answers (`P(A) / (P(A) + P(B))`). No explanation is sampled, so a small judge's
comparison is not lost among dozens of format tokens, and a judge trained on its decision alone
(`agentrl.judge_training`) is read exactly where it was trained.

It needs a judge that returns logprobs: any vLLM server (ours included) and hosted models whose
provider takes `logprobs`/`top_logprobs` (litellm says which, before any call). A judge that refuses
them, or answers without them, has its decisions read from JSON as before (`Readout`), and the
caller is told so once per judge in the log and by the metric `judge_read_from_probabilities`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from agentrl.client.model import JudgeModel
from agentrl.foundation.errors import ConfigurationError
from agentrl.judges.call import (
    InvalidJudgeAnswer,
    JudgeLimiter,
    checked_extra_params,
    judge_sampling,
    litellm_params,
    litellm_refusal,
    retried_judge_call,
)

logger = logging.getLogger(__name__)
T = TypeVar("T")

Readout = Literal["json", "probabilities"]
"""How a judge's decision is read: "json", sampled as constrained JSON with explanations (RULER's, ART's);
"probabilities", from the next-token probabilities of a one-token answer, where the judge returns logprobs."""
READOUTS: tuple[Readout, ...] = ("json", "probabilities")
TOP_LOGPROBS = 20
"""How many of the most likely first tokens the judge returns (vLLM's default cap, OpenAI's maximum)."""


class NoLogprobs(Exception):  # noqa: N818 - a condition, not a failure: the caller reads JSON instead
    """The judge answered without logprobs: its decision cannot be read from probabilities."""


@dataclass(frozen=True)
class DecisionCall:
    """One decision: each answer's probability among the answers (summing to 1), and what it cost."""

    probabilities: dict[str, float]
    attempts: int
    latency_s: float
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float | None


def check_readout(readout: str) -> Readout:
    """`readout` if it is one agentrl knows; else ConfigurationError naming the choices."""
    if readout not in READOUTS:
        raise ConfigurationError(f"readout must be one of {', '.join(READOUTS)}, got {readout!r}")
    return readout


def refuse_json_settings(readout: Readout, **given: object) -> None:
    """ConfigurationError naming each setting of a sampled JSON answer that was given (not None) where the
    judge is trained or asked for one token (`readout="probabilities"`): there it would change nothing."""
    named = [name for name, value in given.items() if value is not None]
    if readout == "probabilities" and named:
        raise ConfigurationError(
            f"{' and '.join(named)} {'does' if len(named) == 1 else 'do'} not apply with readout='probabilities' "
            "(each decision is one token, every pair asked in both orders): leave it unset, or use readout='json'"
        )


_FELL_BACK: set[tuple[str, str]] = set()
"""Judges (model, address) that answered without logprobs once: they are read from JSON from then on."""


def _judge_key(judge_model: JudgeModel) -> tuple[str, str]:
    params = litellm_params(judge_model)
    return params["model"], str(params.get("api_base") or "")


def probabilities_supported(judge_model: JudgeModel) -> bool:
    """Whether litellm sends `logprobs` and `top_logprobs` to this judge (it refuses them for providers
    that do not take them: Anthropic, Ollama, o-series models; no request is made), and the judge has not
    already answered without them."""
    model = litellm_params(judge_model)["model"]
    refused = any(litellm_refusal(model, p, v) for p, v in (("logprobs", True), ("top_logprobs", TOP_LOGPROBS)))
    return not refused and _judge_key(judge_model) not in _FELL_BACK


def note_fallback(judge_model: JudgeModel, why: str) -> None:
    """Log once per judge that its decisions are read from JSON after all, and why; remember it."""
    if _judge_key(judge_model) not in _FELL_BACK:
        _FELL_BACK.add(_judge_key(judge_model))
        logger.warning(
            "judge %s: %s; its decisions are read from sampled JSON instead", _judge_key(judge_model)[0], why
        )


async def from_probabilities(judge_model: JudgeModel, read: Callable[[], Awaitable[T]]) -> T | None:
    """`await read()` where the judge returns logprobs; None where it does not (litellm refuses to send them,
    or the answer came without them), logged once per judge, so the caller reads JSON instead."""
    if not probabilities_supported(judge_model):
        note_fallback(judge_model, "litellm does not send it logprobs")
        return None
    try:
        return await read()
    except NoLogprobs:
        note_fallback(judge_model, "it answered without logprobs")
        return None


def answer_probabilities(response: Any, answers: tuple[str, ...]) -> dict[str, float]:
    """Each answer's share of the probability the judge's first token puts on the answers.

    Tokens are matched by their text without surrounding whitespace (" A" and "A" are both A). An answer
    outside the returned top tokens counts as probability 0; when none of them is there the judge did not
    answer the question (InvalidJudgeAnswer), and a response without logprobs raises NoLogprobs."""
    logprobs = getattr(response.choices[0], "logprobs", None)
    content = getattr(logprobs, "content", None) if logprobs is not None else None
    if not content:
        raise NoLogprobs("the judge's response carries no logprobs")
    mass = dict.fromkeys(answers, 0.0)
    for entry in getattr(content[0], "top_logprobs", None) or [content[0]]:
        token = str(getattr(entry, "token", "")).strip()
        if token in mass:
            mass[token] += math.exp(float(entry.logprob))
    total = sum(mass.values())
    if total <= 0.0:
        shown = [str(getattr(e, "token", "")) for e in (getattr(content[0], "top_logprobs", None) or [])][:5]
        raise InvalidJudgeAnswer(f"none of {list(answers)} is among the judge's likeliest first tokens {shown}")
    return {answer: value / total for answer, value in mass.items()}


async def decision_call(
    judge_model: JudgeModel,
    messages: list[dict[str, Any]],
    answers: tuple[str, ...],
    *,
    limiter: JudgeLimiter | None = None,
    max_attempts: int = 3,
    timeout_s: float = 120.0,
    extra_litellm_params: dict[str, Any] | None = None,
) -> DecisionCall:
    """Ask for a one-token answer among `answers` and read each one's probability (`answer_probabilities`);
    retried like every judge call (JudgeError when it cannot), NoLogprobs when the judge returns none."""
    route = litellm_params(judge_model)
    # One token, always: a caller's max_tokens bounds the JSON answers of a judge read without logprobs.
    extra = {k: v for k, v in (extra_litellm_params or {}).items() if k != "max_tokens"}
    params = {
        **route,
        "messages": messages,
        "max_tokens": 1,
        "logprobs": True,
        "top_logprobs": TOP_LOGPROBS,
        "timeout": timeout_s,
        **judge_sampling(route["model"]),
        "max_retries": 0,
        **checked_extra_params(route["model"], extra),
    }
    call = await retried_judge_call(
        params,
        lambda response: answer_probabilities(response, answers),
        limiter=limiter,
        max_attempts=max_attempts,
        give_up_on=(NoLogprobs,),
    )
    return DecisionCall(
        call.answer, call.attempts, call.latency_s, call.prompt_tokens, call.completion_tokens, call.cost_usd
    )
