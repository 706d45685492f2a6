"""ART's `art.utils.litellm.convert_litellm_choice_to_openai`."""

from __future__ import annotations

from typing import Any

from openai.types.chat.chat_completion import Choice


def convert_litellm_choice_to_openai(choice: Any) -> Choice:
    """A litellm `Choices` (or its dict) as the openai `Choice` a trajectory keeps, extra fields included
    (the gateway's `completion_id` and `token_ids`, which training needs)."""
    data = choice.model_dump() if hasattr(choice, "model_dump") else dict(choice)
    data.setdefault("finish_reason", "stop")
    data["finish_reason"] = data["finish_reason"] or "stop"
    data.setdefault("index", 0)
    return Choice.model_validate(data)
