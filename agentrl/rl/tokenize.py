"""Trajectories -> token tensors for training. Pure: takes a tokenizer, does no I/O.

The contract: assistant turns that the server sampled enter the sequence as exactly the token
ids it sampled (never a re-tokenization of their text), with the sampler's logprobs, and they
alone carry loss. The context before each turn is the engine's own prompt ids where the turn
carries them (`agentrl.rl.engine_context`, the GRPO path); this module renders the rest
(demonstrations, Choices without prompt ids): system, user, tool turns and the template's role
markers come from the model's chat template and are masked.

How the rendering works: each sampled turn is rendered as a unique placeholder string; the rendered conversation is
split at the placeholders; text pieces are tokenized, placeholders replaced by the sampled ids.
If the sampled ids already end with the template's end-of-turn token, the template's copy of it
is not added twice.

Shapes: `_T` tokens of one sequence (micro-batches: `agentrl.rl.micro_batches`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from openai.types.chat.chat_completion import Choice

from agentrl.data.trajectory import History
from agentrl.data.trajectory_group import TrajectoryGroup
from agentrl.foundation.errors import TokenizationError
from agentrl.foundation.sampled_record import SampledRecord

_PLACEHOLDER = "<<agentrl-sampled-turn-{}>>"


class ChatTokenizer(Protocol):
    """The part of a Hugging Face tokenizer that tokenization needs."""

    all_special_ids: list[int]

    def apply_chat_template(self, conversation: list[dict[str, Any]], **kwargs: Any) -> Any: ...

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: list[int], **kwargs: Any) -> str: ...


@dataclass(frozen=True)
class SampledTokens:
    """What the server sampled for one assistant turn, and the prompt it sampled it from (None: unknown)."""

    token_ids: list[int]
    logprobs: list[float]
    prompt_token_ids: list[int] | None = None


VLLM_TOKEN_ID_PREFIX = "token_id:"
"""How vLLM spells a logprob entry's token with `return_tokens_as_token_ids`: "token_id:N"."""


def choice_token_ids(choice: Choice) -> list[int] | None:
    """The token ids a Choice says were sampled (its `SampledRecord`'s, or, from a vLLM endpoint not behind the
    gateway, logprob tokens as vLLM spells ids); None when it carries none. Not yet checked against any
    vocabulary: see `check_token_ids`."""
    token_ids = SampledRecord.of(choice).token_ids
    if token_ids is not None:
        return token_ids
    content = choice.logprobs.content if choice.logprobs is not None else None
    if not content or not all(entry.token.startswith(VLLM_TOKEN_ID_PREFIX) for entry in content):
        return None
    try:
        return [int(entry.token.removeprefix(VLLM_TOKEN_ID_PREFIX)) for entry in content]
    except ValueError:
        return None


def served_tool_order(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Function tools as vLLM's chat route hands them to the template, whatever the client sent: its pydantic
    models' fields in their order (`name`, `description`, `parameters`, each null where absent, then `strict`
    where set) and no other key. A re-rendered system prompt then spells the schemas as the engine did."""
    if not tools:
        return tools
    served = []
    for tool in tools:
        function = tool.get("function")
        if tool.get("type", "function") != "function" or not isinstance(function, dict):
            served.append(tool)  # not a function tool: vLLM would refuse it; render what was recorded
            continue
        rendered = {key: function.get(key) for key in ("name", "description", "parameters")}
        rendered |= {key: function[key] for key in ("strict", "defer_loading") if function.get(key) is not None}
        outer = {key: tool[key] for key in ("defer_loading",) if tool.get(key) is not None}
        served.append({"type": "function", "function": rendered, **outer})
    return served


def labelled_histories(groups: Sequence[TrajectoryGroup]) -> Iterator[tuple[str, History]]:
    """Every conversation of a step, with where it is ("group 2, trajectory 5, additional history 1")."""
    for g, group in enumerate(groups):
        for t, trajectory in enumerate(group.trajectories):
            for h, history in enumerate(trajectory.histories()):
                yield f"group {g}, trajectory {t}" + (f", additional history {h}" if h else ""), history


def check_token_ids(histories: Iterable[tuple[str, History]], vocab_size: int) -> None:
    """`TokenizationError` naming the conversation and turn when a sampled token id is outside [0, vocab_size):
    on a GPU such an id is a device-side assert that breaks the shared trainer for every model."""
    for label, history in histories:
        for turn, choice in enumerate(history.choices()):
            for token_id in [*(choice_token_ids(choice) or ()), *(SampledRecord.of(choice).prompt_token_ids or ())]:
                if not 0 <= token_id < vocab_size:
                    raise TokenizationError(
                        f"{label}, assistant turn {turn}: token id {token_id} is outside the model's vocabulary "
                        f"[0, {vocab_size}); train only on token ids this backend's server sampled"
                    )


def sampled_tokens(choice: Choice) -> SampledTokens:
    """The token ids and logprobs a Choice was sampled with.

    vLLM gives the ids as `choice.token_ids` (with `return_token_ids`) or as logprob tokens spelled
    `token_id:N` (with `return_tokens_as_token_ids`); `model.openai_client()` asks for both.
    """
    content = choice.logprobs.content if choice.logprobs is not None else None
    if not content:
        raise TokenizationError(
            "an assistant turn has no sampled logprobs; sample with `model.openai_client()` (which asks the "
            "server for token ids and logprobs), or set TrainConfig(allow_training_without_logprobs=True) to skip it"
        )
    logprobs = [entry.logprob for entry in content]
    token_ids = choice_token_ids(choice)
    if token_ids is None:
        raise TokenizationError(
            "an assistant turn's logprob tokens are text, not ids: ask the server for "
            "`return_token_ids` or `return_tokens_as_token_ids` (model.openai_client() does)"
        )
    if len(token_ids) != len(logprobs):
        raise TokenizationError(f"an assistant turn has {len(token_ids)} token ids but {len(logprobs)} logprobs")
    return SampledTokens(list(token_ids), logprobs, SampledRecord.of(choice).prompt_token_ids)


@dataclass(frozen=True)
class TokenizedSequence:
    """One conversation as training tokens; position t's logprob is that of token t given tokens < t."""

    input_ids_T: list[int]
    loss_mask_T: list[bool]
    sampler_logprobs_T: list[float]  # 0.0 where the mask is False
    advantage: float
    group_index: int
    history_index: int | None = None
    """Which conversation of the step it trains (None: one of its own): a conversation's turns may take several
    sequences, which share their earlier context (packed into one row: `agentrl.rl.packing.pack_rows`)."""

    def __len__(self) -> int:
        return len(self.input_ids_T)


def demonstrated_tokens(
    messages: list[dict[str, Any]], index: int, tools: list[dict[str, Any]] | None, tokenizer: ChatTokenizer
) -> SampledTokens:
    """Token ids of the hand-written assistant message `messages[index]` as the template renders it.

    For supervised warm starts: the ids run from after the generation prompt through the end-of-turn
    token, so the model learns both what to say (tool-call tags included) and when to stop.
    """
    before = tokenizer.apply_chat_template(messages[:index], tools=tools, tokenize=False, add_generation_prompt=True)
    through = tokenizer.apply_chat_template(messages[: index + 1], tools=tools, tokenize=False)
    if not through.startswith(before):
        raise TokenizationError(f"the chat template renders message {index} in a way that changes the text before it")
    token_ids = tokenizer.encode(through[len(before) :], add_special_tokens=False)
    special = [i for i, t in enumerate(token_ids) if t in set(tokenizer.all_special_ids)]
    if special:  # keep the end-of-turn token; what follows it belongs to the next turn
        token_ids = token_ids[: special[0] + 1]
    return SampledTokens(token_ids, [0.0] * len(token_ids))


def _render_with_placeholders(
    history: History, tokenizer: ChatTokenizer, *, train_on_written_assistant: bool = False
) -> tuple[str, list[SampledTokens]]:
    messages: list[dict[str, Any]] = []
    turns: list[tuple[int, Choice | None]] = []  # (position, sampled choice or None for a written turn)
    for item in history.messages_and_choices:
        if isinstance(item, Choice):
            turns.append((len(messages), item))
            messages.append({"role": "assistant", "content": None})
        elif item.get("content") is None:
            messages.append({**item, "content": ""})
        else:
            messages.append(item)
        if train_on_written_assistant and not isinstance(item, Choice) and item["role"] == "assistant":
            turns.append((len(messages) - 1, None))
    plain = [m if m["content"] is not None else {**m, "content": ""} for m in messages]
    tools = served_tool_order(history.tools)
    sampled = [
        sampled_tokens(choice) if choice is not None else demonstrated_tokens(plain, position, tools, tokenizer)
        for position, choice in turns
    ]
    # Each trained turn is rendered as a placeholder; its ids replace it after tokenization.
    # The sampled ids already spell any tool call, so the template must not render it again.
    for number, (position, _) in enumerate(turns):
        messages[position] = {"role": "assistant", "content": _PLACEHOLDER.format(number)}
    text = tokenizer.apply_chat_template(
        [m if m["content"] is not None else {**m, "content": ""} for m in messages],
        tools=tools,
        tokenize=False,
        add_generation_prompt=False,
    )
    return text, sampled


def tokenize_history(
    history: History,
    tokenizer: ChatTokenizer,
    *,
    advantage: float = 0.0,
    group_index: int = 0,
    train_on_written_assistant: bool = False,
    trained_turns: frozenset[int] | None = None,
) -> TokenizedSequence:
    """One conversation re-rendered -> tokens, loss mask and sampler logprobs (see the module docstring).

    With `train_on_written_assistant` (supervised demonstrations), hand-written assistant messages
    carry loss too, as the chat template renders them; otherwise they are context. `trained_turns`
    (indices among the trained turns; None: all) limits the loss to those turns, the others staying
    as context in their sampled ids.
    """
    text, sampled = _render_with_placeholders(history, tokenizer, train_on_written_assistant=train_on_written_assistant)
    special_ids = set(tokenizer.all_special_ids)
    input_ids: list[int] = []
    loss_mask: list[bool] = []
    logprobs: list[float] = []
    cursor = 0
    duplicate_end: str | None = None
    for index, turn in enumerate(sampled):
        placeholder = _PLACEHOLDER.format(index)
        at = text.find(placeholder, cursor)
        if at < 0 or text.count(placeholder) != 1:
            raise TokenizationError(f"the chat template dropped or repeated sampled assistant turn {index}")
        piece = text[cursor:at]
        if duplicate_end and piece.startswith(duplicate_end):
            piece = piece[len(duplicate_end) :]
        prompt_ids = tokenizer.encode(piece, add_special_tokens=False)
        trained = trained_turns is None or index in trained_turns
        input_ids += prompt_ids + turn.token_ids
        loss_mask += [False] * len(prompt_ids) + [trained] * len(turn.token_ids)
        logprobs += [0.0] * len(prompt_ids) + (turn.logprobs if trained else [0.0] * len(turn.logprobs))
        last = turn.token_ids[-1] if turn.token_ids else None
        duplicate_end = tokenizer.decode([last], skip_special_tokens=False) if last in special_ids else None
        cursor = at + len(placeholder)
    tail = text[cursor:]
    if duplicate_end and tail.startswith(duplicate_end):
        tail = tail[len(duplicate_end) :]
    tail_ids = tokenizer.encode(tail, add_special_tokens=False) if tail else []
    input_ids += tail_ids
    loss_mask += [False] * len(tail_ids)
    logprobs += [0.0] * len(tail_ids)
    return TokenizedSequence(input_ids, loss_mask, logprobs, advantage, group_index)
