"""ART's run layout and saved state: a model's folder, {base_path}/{project}/models/{run_name}, and the JSON state
ART's scripts keep in it (`read_state`, `overwrite_state`/`write_state`, `merge_state`, merged key by key)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentrl.foundation.files import write_json_atomic


def art_model_dir(base_path: str | Path, project: str, name: str) -> Path:
    """Where ART keeps a model's run: {base_path}/{project}/models/{name}."""
    return Path(base_path) / project / "models" / name


def run_name_of(model: Any) -> str:
    """What names a model's run (its folder, object-storage keys, W&B run): ART 0.5.20+'s `run_name` where given,
    else its `name` (ART 0.5.18 and prompted models)."""
    return str(getattr(model, "run_name", None) or model.name)


class RunState:
    """The state helpers of ART's models, over their run folder."""

    name: str
    project: str
    base_path: str

    @property
    def _art_dir(self) -> Path:
        """ART's run folder: {base_path}/{project}/models/{run_name} (`art.utils.output_dirs.get_model_dir`; {name}
        without a `run_name`)."""
        return art_model_dir(self.base_path, self.project, run_name_of(self))

    @property
    def _state_path(self) -> Path:
        return self._art_dir / "state.json"

    def read_state(self) -> dict[str, Any] | None:
        """The run's saved state (your own JSON), or None before any was written."""
        return json.loads(self._state_path.read_text()) if self._state_path.exists() else None

    def overwrite_state(self, state: Mapping[str, Any]) -> None:
        """Replace the run's saved state (written atomically)."""
        write_json_atomic(self._state_path, dict(state))

    def write_state(self, state: Mapping[str, Any]) -> None:
        """ART's name for `overwrite_state`."""
        self.overwrite_state(state)

    def merge_state(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """Merge these keys into the run's saved state, nested dicts key by key (ART's deep merge); returns it."""
        merged = deep_merged(self.read_state() or {}, state)
        self.overwrite_state(merged)
        return merged


def deep_merged(into: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """`into` updated by `update`, where both hold a dict under one key those dicts merged the same way."""
    merged = dict(into)
    for key, value in update.items():
        both = isinstance(value, Mapping) and isinstance(merged.get(key), Mapping)
        merged[key] = deep_merged(merged[key], value) if both else value
    return merged
