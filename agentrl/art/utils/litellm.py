"""ART's `art.utils.litellm.convert_litellm_choice_to_openai`."""

from __future__ import annotations

from typing import Any

from openai.types.chat.chat_completion import Choice

from agentrl.data.messages import choice_from


def convert_litellm_choice_to_openai(choice: Any) -> Choice:
    """A litellm `Choices` (or its dict) as the openai `Choice` a trajectory keeps, extra fields included
    (the gateway's `completion_id`, `policy_step` and `token_ids`, which training needs)."""
    return choice_from(choice.model_dump() if hasattr(choice, "model_dump") else dict(choice))
