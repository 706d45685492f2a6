"""ART's `art.utils.strip_logprobs`: a copy without the sampled logprobs (smaller to log or store)."""

from __future__ import annotations

from typing import Any, TypeVar

from openai.types.chat.chat_completion import Choice

from agentrl.data.trajectory import History
from agentrl.data.trajectory_group import TrajectoryGroup

T = TypeVar("T")


def strip_logprobs(item: T) -> T:
    """A deep copy of a trajectory, group, history, Choice or list of them with every Choice's logprobs
    removed (such a copy can no longer be trained unless `allow_training_without_logprobs`)."""
    return _strip(item)  # type: ignore[no-any-return]


def _strip(item: Any) -> Any:
    if isinstance(item, Choice):
        return item.model_copy(update={"logprobs": None}, deep=True)
    if isinstance(item, TrajectoryGroup):
        return item.with_results([_strip(t) for t in item.trajectories])
    if isinstance(item, History):
        update: dict[str, Any] = {"messages_and_choices": [_strip(m) for m in item.messages_and_choices]}
        if hasattr(item, "additional_histories"):
            update["additional_histories"] = [_strip(h) for h in item.additional_histories]
        return item.model_copy(update=update, deep=True)
    if isinstance(item, list):
        return [_strip(i) for i in item]
    return item
