"""ART 0.5.21+'s `art.get_tokenizer`: a base model's tokenizer, agentrl's packaged model included."""

from __future__ import annotations

from typing import Any

from agentrl.foundation.base_models import resolve_base_model


def get_tokenizer(base_model: str, *, revision: str | None = None, **kwargs: Any) -> Any:
    """The Hugging Face tokenizer of `base_model` (a hub id, a folder, or agentrl's packaged model's name);
    `revision` and other keywords go to `from_pretrained`, as in ART. A fresh instance each call."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_base_model(base_model), revision=revision, **kwargs)
