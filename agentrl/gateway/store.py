"""What the server sampled, kept by completion id for the trainer (bounded: oldest out first).

A client that drops the extra fields of a response (token ids, logprobs) can still have its
completion trained on: the trainer asks for it by the completion's id.
"""

from __future__ import annotations

import logging
import threading
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from agentrl.foundation.errors import TokenizationError
from agentrl.foundation.sampled_record import served_step

logger = logging.getLogger(__name__)


class SampledChoice(BaseModel):
    """One choice of one completion, as the server sampled it."""

    prompt_token_ids: list[int] | None
    token_ids: list[int]
    logprobs: list[float]
    policy_step: int | None = None
    """The step of the adapter that sampled it ("name@step"); None for the base model."""
    incomplete: bool = False
    """The stream was cut before it ended (the replica died, the client hung up): the tokens are a prefix of the
    answer, never trained on (`agentrl.backend.sampled_tokens` refuses them)."""


@dataclass(frozen=True)
class _Kept:
    """A choice packed into typed arrays: 4 bytes per token id, 8 per logprob (Python lists take 36 and 32);
    its prompt is an index into the completion's prompts, which its choices share."""

    prompt: int | None
    token_ids: array[int]
    logprobs: array[float]
    policy_step: int | None
    incomplete: bool


@dataclass(frozen=True)
class _KeptCompletion:
    """A completion's choices and their distinct prompts: n choices of one prompt keep that prompt once."""

    prompts: list[array[int]]
    choices: list[_Kept]

    @classmethod
    def pack(cls, choices: list[SampledChoice]) -> _KeptCompletion:
        prompts: list[array[int]] = []
        kept = []
        for choice in choices:
            index = None
            if choice.prompt_token_ids is not None:
                prompt = array("i", choice.prompt_token_ids)
                index = next((i for i, known in enumerate(prompts) if known == prompt), None)
                if index is None:
                    prompts.append(prompt)
                    index = len(prompts) - 1
            kept.append(
                _Kept(
                    index,
                    array("i", choice.token_ids),
                    array("d", choice.logprobs),
                    choice.policy_step,
                    choice.incomplete,
                )
            )
        return cls(prompts, kept)

    def unpack(self) -> list[SampledChoice]:
        return [
            SampledChoice(
                prompt_token_ids=self.prompts[k.prompt].tolist() if k.prompt is not None else None,
                token_ids=k.token_ids.tolist(),
                logprobs=k.logprobs.tolist(),
                policy_step=k.policy_step,
                incomplete=k.incomplete,
            )
            for k in self.choices
        ]

    @property
    def num_tokens(self) -> int:
        return sum(len(p) for p in self.prompts) + sum(len(k.token_ids) for k in self.choices)


class SampledStore:
    """The sampled token data of recent completions, by completion id: oldest out first beyond
    `max_completions` completions or `max_tokens` tokens (prompts included, once per completion), so memory
    stays bounded (about 20 bytes a token) however long the run. A completion larger than the whole token
    bound is not kept (a warning says so; its Choices still carry their tokens).

    Thread-safe: the gateway's thread puts, the trainer's caller gets.
    """

    def __init__(self, max_completions: int = 100_000, max_tokens: int = 20_000_000) -> None:
        self.max_completions = max_completions
        self.max_tokens = max_tokens
        self._by_id: OrderedDict[str, _KeptCompletion] = OrderedDict()
        self._num_tokens = 0
        self._by_rollout: OrderedDict[str, int] = OrderedDict()
        """Completion tokens sampled per rollout id (`ROLLOUT_HEADER`), the newest `max_completions` rollouts."""
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._by_id)

    @property
    def num_tokens(self) -> int:
        """Tokens kept, prompts included."""
        return self._num_tokens

    def put(self, completion_id: str, choices: list[SampledChoice], rollout: str | None = None) -> None:
        """Keep a completion's choices; with `rollout`, add their tokens to that rollout's tally."""
        if rollout is not None:
            with self._lock:
                self._by_rollout[rollout] = self._by_rollout.pop(rollout, 0) + sum(len(c.token_ids) for c in choices)
                while len(self._by_rollout) > self.max_completions:
                    self._by_rollout.popitem(last=False)
        kept = _KeptCompletion.pack(choices)
        if kept.num_tokens > self.max_tokens:
            logger.warning(
                "completion %s has %d tokens, more than the gateway's whole store (%d): not kept for lookup by id",
                completion_id,
                kept.num_tokens,
                self.max_tokens,
            )
            return
        with self._lock:
            if (previous := self._by_id.pop(completion_id, None)) is not None:
                self._num_tokens -= previous.num_tokens
            self._by_id[completion_id] = kept
            self._num_tokens += kept.num_tokens
            while len(self._by_id) > self.max_completions or self._num_tokens > self.max_tokens:
                _, evicted = self._by_id.popitem(last=False)
                self._num_tokens -= evicted.num_tokens

    def rollout_tokens(self, rollout: str) -> int | None:
        """Completion tokens sampled for a rollout id; None when none were sampled under it (or long ago)."""
        with self._lock:
            return self._by_rollout.get(rollout)

    def get(self, completion_id: str) -> list[SampledChoice]:
        """The choices of a completion; `TokenizationError` naming the fix when it is not (or no longer) kept."""
        with self._lock:
            kept = self._by_id.get(completion_id)
        if kept is None:
            raise TokenizationError(
                f"the gateway keeps no sampled tokens for completion {completion_id!r}: it was not sampled through this "
                f"gateway, or it was evicted (the gateway keeps the last {self.max_completions} completions and "
                f"{self.max_tokens} tokens). Keep the Choice with its token_ids/logprobs, or train sooner after sampling"
            )
        return kept.unpack()


def sampled_choices(response: dict[str, Any]) -> list[SampledChoice]:
    """The token data of a whole (non-streamed) chat or text completion response, one per choice."""
    prompt_ids = response.get("prompt_token_ids")
    policy_step = served_step(response.get("model"))
    choices = []
    for choice in sorted(response.get("choices") or [], key=lambda c: c.get("index", 0)):
        choices.append(
            SampledChoice(
                prompt_token_ids=prompt_ids or choice.get("prompt_token_ids"),
                token_ids=list(choice.get("token_ids") or []),
                logprobs=_logprob_values(choice.get("logprobs")),
                policy_step=policy_step,
            )
        )
    return choices


def _logprob_values(logprobs: dict[str, Any] | None) -> list[float]:
    if not logprobs:
        return []
    if "content" in logprobs:  # chat: [{"token", "logprob", ...}]
        return [entry["logprob"] for entry in logprobs["content"] or []]
    return list(logprobs.get("token_logprobs") or [])  # text completions


class StreamAccumulator:
    """Collects a streamed completion's token data chunk by chunk, per choice index."""

    def __init__(self) -> None:
        self.completion_id: str | None = None
        self.policy_step: int | None = None
        self.prompt_token_ids: list[int] | None = None
        self.token_ids: dict[int, list[int]] = {}
        self.logprobs: dict[int, list[float]] = {}
        self.finished: set[int] = set()
        """Choices whose last chunk (with a finish_reason) arrived."""

    def add(self, chunk: dict[str, Any]) -> None:
        self.completion_id = self.completion_id or chunk.get("id")
        self.policy_step = self.policy_step if self.policy_step is not None else served_step(chunk.get("model"))
        if chunk.get("prompt_token_ids"):
            self.prompt_token_ids = chunk["prompt_token_ids"]
        for choice in chunk.get("choices") or []:
            index = choice.get("index", 0)
            self.token_ids.setdefault(index, []).extend(choice.get("token_ids") or [])
            self.logprobs.setdefault(index, []).extend(_logprob_values(choice.get("logprobs")))
            if choice.get("finish_reason"):
                self.finished.add(index)

    def choices(self) -> list[SampledChoice]:
        """The choices so far, each marked incomplete until its finishing chunk arrived."""
        return [
            SampledChoice(
                prompt_token_ids=self.prompt_token_ids,
                token_ids=self.token_ids[i],
                logprobs=self.logprobs[i],
                policy_step=self.policy_step,
                incomplete=i not in self.finished,
            )
            for i in sorted(self.token_ids)
        ]
