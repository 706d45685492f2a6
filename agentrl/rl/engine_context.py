"""A conversation's training sequences in the token context the engine sampled each turn from. Pure, no I/O.

A multi-turn agent's next prompt is not its previous prompt plus the tokens it sampled: the server parses a
tool call out of the sampled text, the client sends it back as JSON, and the chat template renders that
JSON again (whitespace dropped, keys re-spelled, the same text split into other tokens). A trainer that
re-renders the conversation scores every later turn under a context the model never saw. So each sampled
turn carries the engine's own `prompt_token_ids` (the gateway keeps them by completion id and the backend
puts them on the Choice), and a turn's training sequence is exactly that prompt followed by the sampled ids.

A turn whose prompt starts with the whole sequence so far (the usual case: a plain reply re-tokenizes as it
was sampled) continues that sequence, so a conversation that renders back exactly costs one sequence, as
before. A turn whose prompt does not starts a new sequence; the sequences of one conversation share their
common prefix (the system prompt, tool schemas, earlier turns) and shared-prefix packing computes it once.

A turn without the engine's prompt ids (a Choice built by hand, or one whose completion the gateway no
longer keeps) cannot be made exact: it is trained in the re-rendered context and counted as inexact, or
refused with `TrainConfig(require_exact_context=True)`.

Shapes: `_T` tokens of one sequence; `_P` groups of a step, `_G` trajectories of a group.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from agentrl.data.trajectory import History
from agentrl.data.trajectory_group import TrajectoryGroup
from agentrl.foundation.errors import TokenizationError
from agentrl.rl.ledger import trajectory_tokens
from agentrl.rl.tokenize import ChatTokenizer, SampledTokens, TokenizedSequence, sampled_tokens, tokenize_history


@dataclass(frozen=True)
class HistorySequences:
    """A conversation's training sequences, and how many of its sampled turns were scored under the exact
    context the engine sampled them from."""

    sequences: list[TokenizedSequence]
    num_turns: int
    num_exact_turns: int


def engine_sequences(turns: Sequence[SampledTokens], *, advantage: float, group_index: int) -> list[TokenizedSequence]:
    """Each turn as its engine prompt followed by its sampled ids (the only tokens with loss); a turn whose
    prompt extends the sequence so far continues it instead of starting a new one."""
    sequences: list[TokenizedSequence] = []
    ids_T: list[int] = []
    loss_mask_T: list[bool] = []
    logprobs_T: list[float] = []
    for turn in turns:
        prompt = turn.prompt_token_ids
        if prompt is None:
            raise TokenizationError("engine_sequences takes turns that carry the engine's prompt_token_ids")
        if ids_T and len(prompt) >= len(ids_T) and prompt[: len(ids_T)] == ids_T:
            context = prompt[len(ids_T) :]
        else:
            if ids_T:
                sequences.append(TokenizedSequence(ids_T, loss_mask_T, logprobs_T, advantage, group_index))
            ids_T, loss_mask_T, logprobs_T = [], [], []
            context = prompt
        ids_T = ids_T + context + turn.token_ids
        loss_mask_T = loss_mask_T + [False] * len(context) + [True] * len(turn.token_ids)
        logprobs_T = logprobs_T + [0.0] * len(context) + turn.logprobs
    if ids_T:
        sequences.append(TokenizedSequence(ids_T, loss_mask_T, logprobs_T, advantage, group_index))
    return sequences


def history_sequences(
    history: History, tokenizer: ChatTokenizer, *, advantage: float = 0.0, group_index: int = 0
) -> HistorySequences:
    """A conversation's sampled turns as training sequences: those with the engine's prompt ids in exactly
    that context (`engine_sequences`), the others (if any) in one re-rendered sequence where only they carry
    loss."""
    turns = [sampled_tokens(choice) for choice in history.choices()]
    exact = [turn for turn in turns if turn.prompt_token_ids is not None]
    sequences = engine_sequences(exact, advantage=advantage, group_index=group_index)
    rendered = frozenset(index for index, turn in enumerate(turns) if turn.prompt_token_ids is None)
    if rendered:
        sequences.append(
            tokenize_history(history, tokenizer, advantage=advantage, group_index=group_index, trained_turns=rendered)
        )
    return HistorySequences(sequences, len(turns), len(exact))


@dataclass(frozen=True)
class TokenizedGroups:
    """Training sequences for a step; the sampled turns they train and how many of those are context-exact; the
    trajectories skipped for lacking token data (and their sampled tokens, where they carry any count of them:
    the ledger's `no_token_data`)."""

    sequences: list[TokenizedSequence]
    num_skipped_trajectories: int
    num_skipped_tokens: int = 0
    num_turns: int = 0
    num_exact_turns: int = 0
    num_histories: int = 0
    """Conversations trained: what a step's sequence count meant before a conversation could take several
    (the Dr. GRPO denominator and the learning rate's sequence scaling count these)."""


def tokenize_groups(
    groups: Sequence[TrajectoryGroup],
    advantages_P_G: Sequence[Sequence[float]],
    tokenizer: ChatTokenizer,
    *,
    allow_missing_logprobs: bool = False,
    require_exact_context: bool = False,
) -> TokenizedGroups:
    """Every history with a sampled turn, of every trajectory, tagged with its advantage and group. With
    `require_exact_context`, a turn whose engine context is unknown raises `TokenizationError` (never skipped)."""
    sequences: list[TokenizedSequence] = []
    skipped = skipped_tokens = turns = exact = histories = 0
    for group_index, (group, advantages_G) in enumerate(zip(groups, advantages_P_G, strict=True)):
        for member, (trajectory, advantage) in enumerate(zip(group.trajectories, advantages_G, strict=True)):
            try:
                tokenized = [
                    history_sequences(h, tokenizer, advantage=advantage, group_index=group_index)
                    for h in trajectory.histories()
                    if h.choices()
                ]
            except TokenizationError as error:
                if not allow_missing_logprobs:
                    raise TokenizationError(f"group {group_index}, trajectory {member}: {error}") from error
                skipped += 1
                skipped_tokens += trajectory_tokens(trajectory)
                continue
            for number, history in enumerate(tokenized):
                if require_exact_context and history.num_exact_turns < history.num_turns:
                    raise TokenizationError(
                        f"group {group_index}, trajectory {member}, history {number}: "
                        f"{history.num_turns - history.num_exact_turns} of {history.num_turns} sampled turns carry "
                        "no prompt_token_ids, so the context they were sampled in is unknown (Choices built by hand, "
                        "or completions the gateway no longer keeps). Sample them through the model's gateway and "
                        "train soon after, or leave TrainConfig(require_exact_context=False) to train them in the "
                        "re-rendered context, counted in the step's context_exact_turns"
                    )
                sequences += [dataclasses.replace(s, history_index=histories) for s in history.sequences]
                turns += history.num_turns
                exact += history.num_exact_turns
                histories += 1
    return TokenizedGroups(sequences, skipped, skipped_tokens, turns, exact, histories)
