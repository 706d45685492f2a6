"""Sampled token ids, and the prompt ids they were sampled from, put back into a step's groups from the gateway's
store by completion id: the backend joins what the rollouts returned with what the server sampled and saw."""

from __future__ import annotations

from typing import Any

from openai.types.chat.chat_completion import Choice

from agentrl.data.trajectory_group import TrajectoryGroup
from agentrl.foundation.errors import TokenizationError
from agentrl.foundation.sampled_record import SampledRecord
from agentrl.gateway.store import SampledStore


def fill_sampled_tokens(groups: list[TrajectoryGroup], store: SampledStore) -> list[TrajectoryGroup]:
    """Groups whose Choices name their `completion_id` get what they lack of it from `store`: the sampled token
    ids and logprobs (for clients that drop a response's extra fields), and the engine's `prompt_token_ids`,
    the exact context the trainer scores the turn in (`agentrl.rl.engine_context`).

    A Choice with its own token ids gets the prompt ids only where the store's ids for it are the same (else the
    id is not this turn's, and the turn trains in the re-rendered context, counted as inexact). A completion the
    store no longer keeps is an error only for a Choice without token ids. Message dicts are untouched.
    """
    return [_filled_group(group, store) for group in groups]


def _filled_group(group: TrajectoryGroup, store: SampledStore) -> TrajectoryGroup:
    choices = (c for t in group.trajectories for h in t.histories() for c in h.choices())
    if not any(_needs_lookup(SampledRecord.of(c)) for c in choices):
        return group
    trajectories = []
    for trajectory in group.trajectories:
        items = [_filled(item, store) for item in trajectory.messages_and_choices]
        extra = [
            h.model_copy(update={"messages_and_choices": [_filled(i, store) for i in h.messages_and_choices]})
            for h in trajectory.additional_histories
        ]
        trajectories.append(
            trajectory.model_copy(update={"messages_and_choices": items, "additional_histories": extra})
        )
    return group.with_results(trajectories)


def _needs_lookup(record: SampledRecord) -> bool:
    # Without `token_ids` a Choice may still hold logprobs whose tokens are text (litellm keeps those):
    # only the ids the server sampled are exact, so the store's copy wins.
    return record.completion_id is not None and (record.token_ids is None or record.prompt_token_ids is None)


def _filled(item: Any, store: SampledStore) -> Any:
    if not isinstance(item, Choice) or not _needs_lookup(record := SampledRecord.of(item)):
        return item
    completion_id = str(record.completion_id)
    if record.token_ids is not None:
        return _with_prompt(item, record, store)
    choices = store.get(completion_id)
    if item.index >= len(choices):
        raise TokenizationError(f"completion {completion_id!r} has {len(choices)} choices, not an index {item.index}")
    sampled = choices[item.index]
    if sampled.incomplete:
        raise TokenizationError(
            f"completion {completion_id!r} was cut off mid-stream (its replica died or its client hung up): its "
            f"{len(sampled.token_ids)} tokens are not the whole answer. Drop this trajectory (or let the rollout fail)"
        )
    # The ids are the record's `token_ids`; the store keeps no token text, so each logprob entry's is empty.
    content: list[dict[str, Any]] = [
        {"token": "", "logprob": logprob, "bytes": None, "top_logprobs": []}
        for _, logprob in zip(sampled.token_ids, sampled.logprobs, strict=True)
    ]
    filled = SampledRecord(
        completion_id=completion_id,
        policy_step=record.policy_step if record.policy_step is not None else sampled.policy_step,
        token_ids=sampled.token_ids,
        prompt_token_ids=sampled.prompt_token_ids,
    )
    return Choice.model_validate({**item.model_dump(), "logprobs": {"content": content}, **filled.stamps()})


def _with_prompt(item: Choice, record: SampledRecord, store: SampledStore) -> Choice:
    """A Choice that kept its token ids, with the prompt ids the store holds for exactly those ids."""
    try:
        choices = store.get(str(record.completion_id))
    except TokenizationError:
        return item  # evicted or sampled elsewhere: its context is re-rendered and counted as inexact
    sampled = choices[item.index] if item.index < len(choices) else None
    if sampled is None or sampled.prompt_token_ids is None or sampled.token_ids != record.token_ids:
        return item
    filled = SampledRecord(
        completion_id=record.completion_id,
        policy_step=record.policy_step,
        token_ids=record.token_ids,
        prompt_token_ids=sampled.prompt_token_ids,
    )
    return Choice.model_validate({**item.model_dump(), **filled.stamps()})
