"""What the ART scripts' modules share: the packaged model with greedy generation defaults, and one ART
`LocalBackend` serving every model of the package's slow tests (one server start for all of them)."""

from __future__ import annotations

import json

import pytest

from agentrl.art.local import LocalBackend


@pytest.fixture(scope="package")
def base_model(tmp_path_factory) -> str:
    """The packaged model, its generation_config asking for near-greedy sampling (as Qwen's asks for 0.7):
    ART's server, and so agentrl's, must ignore it, so a request without temperature samples at 1.0."""
    from pathlib import Path

    from agentrl.foundation.base_models import resolve_base_model

    source = Path(resolve_base_model("smollm2-135m-instruct"))
    folder = tmp_path_factory.mktemp("models") / "smollm2-with-greedy-defaults"
    folder.mkdir()
    for file in source.iterdir():
        if file.name != "generation_config.json":
            (folder / file.name).symlink_to(file)
    defaults = json.loads((source / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**defaults, "temperature": 0.05, "top_k": 1}))
    return str(folder)


@pytest.fixture(scope="package")
def backend(tmp_path_factory):
    with LocalBackend(path=str(tmp_path_factory.mktemp("art"))) as backend:
        yield backend
    assert backend._engine is None and not backend.sessions  # the with block closed it: server stopped, runs released
