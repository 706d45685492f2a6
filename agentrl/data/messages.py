"""Chat messages and sampled choices, checked as they enter a conversation.

A conversation mixes plain message dicts (system, user, tool results, hand-written assistant turns)
with the `openai` `Choice` objects a server returned (they keep the sampled token ids and logprobs).
Whatever a client hands over (a litellm `Choices`, a Responses or Anthropic Messages answer, a bare
message) becomes one of those two, and a malformed message raises naming its field, when it is added.
"""

from __future__ import annotations

from typing import Annotated, Any

from openai.types.chat.chat_completion import Choice
from pydantic import BaseModel, BeforeValidator

MESSAGE_ROLES = ("system", "developer", "user", "assistant", "tool")


def _check_tool_calls(tool_calls: Any) -> None:
    if not isinstance(tool_calls, list):
        raise ValueError(f"'tool_calls' must be a list of tool-call dicts, got {type(tool_calls).__name__}")
    for j, call in enumerate(tool_calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ValueError(f"tool_calls[{j}] needs a 'function' dict with a string 'name'")
        if not isinstance(function.get("arguments"), str):
            raise ValueError(f"tool_calls[{j}].function.arguments must be a JSON string (use json.dumps)")


def _check_message(message: dict[str, Any]) -> dict[str, Any]:
    """Validate the fields that rendering and training rely on; raise ValueError naming the field."""
    role = message.get("role")
    if role is None:
        raise ValueError(f"message has no 'role'; give it one of {MESSAGE_ROLES}")
    if role not in MESSAGE_ROLES:
        raise ValueError(f"'role' is {role!r}; it must be one of {MESSAGE_ROLES}")
    content = message.get("content")
    if "content" in message and content is None and role == "user":  # ART accepts it; the template gets ""
        message = {**message, "content": ""}
        content = ""
    content_optional = role == "assistant" and message.get("tool_calls")
    if content is None and not content_optional:
        raise ValueError(f"a {role} message needs 'content' (a string or a list of content parts)")
    if content is not None and not isinstance(content, (str, list)):
        raise ValueError(f"'content' must be a string or a list of content parts, got {type(content).__name__}")
    if "tool_calls" in message and message["tool_calls"] is not None:
        if role != "assistant":
            raise ValueError(f"only assistant messages may have 'tool_calls', this one has role {role!r}")
        _check_tool_calls(message["tool_calls"])
    if role == "tool" and not isinstance(message.get("tool_call_id"), str):
        raise ValueError("a tool message needs 'tool_call_id' (the id of the call it answers)")
    return message


def choice_from(data: dict[str, Any]) -> Choice:
    """An openai `Choice` from a choice's fields (JSON, or a litellm `Choices` dumped), the gateway's
    fields included: litellm keeps them under `provider_specific_fields`, where training cannot see them."""
    data = dict(data)
    for key, value in (data.pop("provider_specific_fields", None) or {}).items():
        data.setdefault(key, value)  # completion_id, policy_step, token_ids
    data["finish_reason"] = data.get("finish_reason") or "stop"
    data.setdefault("index", 0)
    return Choice.model_validate(data)


def _to_message_or_choice(item: Any) -> dict[str, Any] | Choice:
    if isinstance(item, Choice):
        return item
    if isinstance(item, BaseModel):  # a litellm Choices, or a ChatCompletionMessage passed instead of its Choice
        item = item.model_dump(exclude_none=True)
    if not isinstance(item, dict):
        raise ValueError(f"expected a message dict or an openai Choice, got {type(item).__name__}")
    if "message" in item and ("finish_reason" in item or "provider_specific_fields" in item):  # a choice
        return choice_from(item)
    if item.get("object") == "response" and "output" in item:  # an OpenAI Responses answer
        from agentrl.gateway.responses_api import choice_fields as response_choice

        return choice_from(response_choice(item))
    if item.get("type") == "message" and item.get("role") == "assistant" and "stop_reason" in item:  # Anthropic's
        from agentrl.gateway.messages_api import choice_fields as message_choice

        return choice_from(message_choice(item))
    return _check_message(item)


MessageOrChoice = Annotated[Any, BeforeValidator(_to_message_or_choice)]


class CheckedList(list):  # type: ignore[type-arg]
    """A conversation list that checks what is added to it, as the constructor does: a litellm
    `Choices` appended as it comes becomes an openai `Choice` (its gateway token data kept), and a
    malformed message raises at the `append` that adds it, not at training."""

    def append(self, item: Any) -> None:
        super().append(_to_message_or_choice(item))

    def extend(self, items: Any) -> None:
        super().extend(_to_message_or_choice(item) for item in items)

    def insert(self, index: Any, item: Any) -> None:
        super().insert(index, _to_message_or_choice(item))

    def __setitem__(self, index: Any, value: Any) -> None:
        if isinstance(index, slice):
            super().__setitem__(index, [_to_message_or_choice(item) for item in value])
        else:
            super().__setitem__(index, _to_message_or_choice(value))

    def __iadd__(self, items: Any) -> CheckedList:  # type: ignore[misc]
        self.extend(items)
        return self


def choice_to_message(choice: Choice) -> dict[str, Any]:
    """The assistant message dict that a Choice stands for, as the chat API expects it back."""
    message: dict[str, Any] = {"role": "assistant", "content": choice.message.content}
    if choice.message.tool_calls:
        message["tool_calls"] = [
            call.model_dump(include={"id", "type", "function"}) for call in choice.message.tool_calls
        ]
    return message
