"""The record of one sampled completion choice, typed: what the gateway stamps on every Choice it returns (the
completion's id, the adapter step that sampled it, the token ids and the engine's prompt ids), written in one
place and read by field everywhere; and a trained adapter's served name, `{name}@{step}`, made and read here alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from agentrl.foundation.errors import TokenizationError

__all__ = ["SampledRecord", "served_name", "served_step", "served_by"]

_STEP_SEPARATOR = "@"


def served_name(name: str, step: int) -> str:
    """The name a server serves a model's adapter of `step` under: "{name}@{step}"."""
    return f"{name}{_STEP_SEPARATOR}{step}"


def served_step(served: object) -> int | None:
    """The step of a served adapter's name ("agent@12" -> 12); None for any other name (the base model's)."""
    if not isinstance(served, str):
        return None
    name, separator, step = served.rpartition(_STEP_SEPARATOR)
    return int(step) if name and separator and step.isascii() and step.isdigit() else None


def served_by(served: object, name: str) -> bool:
    """Whether `served` is one of model `name`'s adapters, at any step."""
    return isinstance(served, str) and served_step(served) is not None and served.rpartition(_STEP_SEPARATOR)[0] == name


class SampledRecord(BaseModel):
    """What the server sampled for one choice, as the gateway stamps it (extra fields of the Choice a client
    gets): `completion_id` names it in the gateway's store, `policy_step` is the step of the adapter that
    sampled it (None: the base model), `token_ids` the sampled ids, `prompt_token_ids` the context the engine
    sampled them in (put there from the store when the trainer needs it)."""

    model_config = ConfigDict(frozen=True)

    completion_id: str | None = None
    policy_step: int | None = None
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None

    @classmethod
    def of(cls, choice: Any) -> SampledRecord:
        """The record a Choice (an openai model, or its JSON as a dict) carries; fields it lacks are None.
        `TokenizationError` when its ids are not lists of whole numbers (a hand-written or corrupted turn)."""
        extra = _extra_fields(choice)
        return cls.naming(choice).model_copy(
            update={
                "token_ids": _whole_numbers(extra.get("token_ids"), "token_ids"),
                "prompt_token_ids": _whole_numbers(extra.get("prompt_token_ids"), "prompt_token_ids"),
            }
        )

    @classmethod
    def naming(cls, choice: Any) -> SampledRecord:
        """Its id and step alone, what names a choice where its tokens travel elsewhere (the store, a later
        chunk) or are not needed: its ids are not read."""
        extra = _extra_fields(choice)
        completion_id, policy_step = extra.get("completion_id"), extra.get("policy_step")
        return cls.model_construct(
            completion_id=str(completion_id) if completion_id else None,
            policy_step=policy_step if type(policy_step) is int else None,
            token_ids=None,
            prompt_token_ids=None,
        )

    def stamps(self) -> dict[str, Any]:
        """The fields it has, as the extra fields of a Choice (or a Responses/Messages answer) in JSON."""
        return {key: value for key, value in self.__dict__.items() if value is not None}

    @property
    def from_gateway(self) -> bool:
        """Stamped by agentrl's gateway from a trained adapter (not the base model, not another endpoint)."""
        return self.completion_id is not None and self.policy_step is not None


def _extra_fields(choice: Any) -> Mapping[str, Any]:
    return choice if isinstance(choice, Mapping) else (getattr(choice, "model_extra", None) or {})


def _whole_numbers(ids: object, field: str) -> list[int] | None:
    if ids is None:
        return None
    if not isinstance(ids, list) or not all(type(t) is int for t in ids):
        raise TokenizationError(f"an assistant turn's {field} must be a list of whole numbers: {ids!r:.80}")
    return ids
