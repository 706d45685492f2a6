"""ART's `art.utils.output_dirs`: where a run's files are, in ART's layout ({art_path}/{project}/models/{name}).

`art_path` defaults to `.art` in the repository root (`get_repo_root_path`), as ART's. agentrl keeps a step's
trajectories as files, `trajectories/{split}-{step:04d}.jsonl`, not in a folder per split: the one function
that would name such a folder raises, naming where they are.
"""

from __future__ import annotations

import os
from typing import Any

from agentrl.foundation.errors import ConfigurationError

from ..state import run_name_of

__all__ = [
    "get_default_art_path",
    "get_model_dir",
    "get_models_dir",
    "get_output_dir_from_model_properties",
    "get_step_checkpoint_dir",
    "get_trajectories_dir",
    "get_trajectories_split_dir",
]


def get_default_art_path() -> str:
    """`.art` in the repository root."""
    from . import get_repo_root_path

    return os.path.join(get_repo_root_path(), ".art")


def get_models_dir(project_name: str, art_path: str | None = None) -> str:
    return f"{art_path or get_default_art_path()}/{project_name}/models"


def get_model_dir(model: Any, art_path: str | None = None) -> str:
    return f"{art_path or get_default_art_path()}/{model.project}/models/{run_name_of(model)}"


def get_output_dir_from_model_properties(project: str, name: str, art_path: str | None = None) -> str:
    return f"{art_path or get_default_art_path()}/{project}/models/{name}"


def get_step_checkpoint_dir(model_output_dir: str, step: int) -> str:
    return f"{model_output_dir}/checkpoints/{step:04d}"


def get_trajectories_dir(model_output_dir: str) -> str:
    return f"{model_output_dir}/trajectories"


def get_trajectories_split_dir(model_output_dir: str, split: str) -> str:
    """ART keeps a folder per split; agentrl keeps files per split and step."""
    raise ConfigurationError(
        f"agentrl keeps no folder per split: {split}'s trajectories are the files "
        f"{model_output_dir}/trajectories/{split}-NNNN.jsonl (agentrl.records.run_folder.RunFolder.trajectory_files)"
    )
