"""Shared fixtures: the packaged model's real tokenizer; the real vLLM server lives in tests/server_fixtures.py."""

import pytest


@pytest.fixture(scope="session")
def base_model_path() -> str:
    from agentrl.base_models import resolve_base_model

    return resolve_base_model("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def tokenizer(base_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(base_model_path)
