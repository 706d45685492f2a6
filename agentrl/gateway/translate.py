"""What the Responses and Messages translations share: the gateway's stamps, and the chat Choice an
answer in either format stands for."""

from __future__ import annotations

from typing import Any

from agentrl.foundation.sampled_record import SampledRecord


def stamped(answer: dict[str, Any], choice: dict[str, Any]) -> dict[str, Any]:
    """`answer` with the gateway's stamps of a chat `choice` added (its `SampledRecord`)."""
    return {**answer, **SampledRecord.of(choice).stamps()}


def chat_choice(
    texts: list[str], tool_calls: list[dict[str, Any]], finish_reason: str, answer: dict[str, Any]
) -> dict[str, Any]:
    """A chat Choice's fields for an answer's text and tool calls, with its `completion_id` and `policy_step`
    (not its token ids: the trainer takes the exact tokens and their logprobs from the store by id)."""
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    fields: dict[str, Any] = {"index": 0, "finish_reason": finish_reason, "message": message}
    return {**fields, **SampledRecord.naming(answer).stamps()}
