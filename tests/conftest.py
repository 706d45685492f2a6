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


@pytest.fixture(scope="session")
async def served_model(tmp_path_factory):
    """The packaged model registered with a real LocalBackend (vLLM on loopback + the trainer), for the session."""
    import agentrl

    model = agentrl.TrainableModel(name="test-agent", project="tests", base_path=str(tmp_path_factory.mktemp("runs")))
    backend = agentrl.LocalBackend()
    await model.register(backend)
    yield model
    await backend.close()
