"""Sampled token ids put back into a step's groups from the gateway's store, for Choices that kept only their
completion id: the backend joins what the rollouts returned with what the server sampled."""

from __future__ import annotations

from typing import Any

from openai.types.chat.chat_completion import Choice

from agentrl.errors import TokenizationError
from agentrl.gateway.store import SampledStore
from agentrl.trajectory import TrajectoryGroup


def fill_sampled_tokens(groups: list[TrajectoryGroup], store: SampledStore) -> list[TrajectoryGroup]:
    """Groups whose Choices lack token data but name their `completion_id` get it from `store`.

    For clients that drop a response's extra fields: keep the completion's id on the Choice
    (`choice.completion_id = completion.id`, or the gateway's own stamp) and the trainer still
    trains on the exact tokens sampled. Choices with token data, and message dicts, are untouched.
    """
    return [_filled_group(group, store) for group in groups]


def _filled_group(group: TrajectoryGroup, store: SampledStore) -> TrajectoryGroup:
    if not any(_needs_lookup(c) for t in group.trajectories for h in t.histories() for c in h.choices()):
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


def _needs_lookup(choice: Choice) -> bool:
    # Without `token_ids` a Choice may still hold logprobs whose tokens are text (litellm keeps those):
    # only the ids the server sampled are exact, so the store's copy wins.
    extra = choice.model_extra or {}
    return extra.get("token_ids") is None and bool(extra.get("completion_id"))


def _filled(item: Any, store: SampledStore) -> Any:
    if not isinstance(item, Choice) or not _needs_lookup(item):
        return item
    completion_id = str((item.model_extra or {})["completion_id"])
    choices = store.get(completion_id)
    if item.index >= len(choices):
        raise TokenizationError(f"completion {completion_id!r} has {len(choices)} choices, not an index {item.index}")
    sampled = choices[item.index]
    if sampled.incomplete:
        raise TokenizationError(
            f"completion {completion_id!r} was cut off mid-stream (its replica died or its client hung up): its "
            f"{len(sampled.token_ids)} tokens are not the whole answer. Drop this trajectory (or let the rollout fail)"
        )
    content: list[dict[str, Any]] = [
        {"token": f"token_id:{token_id}", "logprob": logprob, "bytes": None, "top_logprobs": []}
        for token_id, logprob in zip(sampled.token_ids, sampled.logprobs, strict=True)
    ]
    data = {**item.model_dump(), "logprobs": {"content": content}, "token_ids": sampled.token_ids}
    if sampled.policy_step is not None:
        data.setdefault("policy_step", sampled.policy_step)
    return Choice.model_validate(data)
