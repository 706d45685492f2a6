"""The SkyPilot recipe for a GPU host: its fields are SkyPilot's documented ones, and the command it
runs is one `agentrl backend serve` accepts. (SkyPilot's own parser: scripts/check_skypilot.py, in a
throwaway virtualenv, since SkyPilot would pin older click and uvicorn here.)"""

from __future__ import annotations

import shlex
from pathlib import Path

import typer
import yaml

from agentrl.cli import app

RECIPE = Path(__file__).resolve().parent.parent / "deploy" / "skypilot" / "gpu-backend.yaml"
# From SkyPilot's YAML reference (docs.skypilot.co, reference/yaml-spec): task and resources fields.
TASK_FIELDS = {"name", "workdir", "num_nodes", "resources", "envs", "secrets", "file_mounts", "setup", "run", "config"}
RESOURCES_FIELDS = {"infra", "cloud", "region", "zone", "accelerators", "accelerator_args", "cpus", "memory",
                    "instance_type", "use_spot", "disk_size", "disk_tier", "network_tier", "image_id", "ports",
                    "labels", "autostop", "any_of", "ordered", "job_recovery"}  # fmt: skip


def test_the_gpu_recipe_uses_documented_fields_a_required_token_and_a_command_that_exists():
    recipe = yaml.safe_load(RECIPE.read_text())
    assert set(recipe) <= TASK_FIELDS and set(recipe["resources"]) <= RESOURCES_FIELDS
    assert recipe["secrets"] == {"AGENTRL_TOKEN": None}  # null: `sky launch` refuses to start without it
    assert "scripts/setup.sh" in recipe["setup"]  # the GPU branch of the one set-up script
    words = shlex.split(recipe["run"].replace("\\\n", " "))
    assert words[:3] == [".venv/bin/agentrl", "backend", "serve"]
    serve = typer.main.get_command(app).commands["backend"].commands["serve"]  # type: ignore[attr-defined]
    options = {flag for param in serve.params for flag in param.opts}
    used = {word for word in words if word.startswith("--")}
    assert used <= options, used - options
    assert words[words.index("--host") + 1] == "127.0.0.1"  # reached through an SSH tunnel, not an open port
