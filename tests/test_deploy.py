"""The SkyPilot recipes (one GPU host; several hosts): their fields are SkyPilot's documented ones, their run
scripts are valid bash, and every agentrl command they run is one the CLI accepts. (SkyPilot's own parser: scripts/check_skypilot.py, in a
throwaway virtualenv, since SkyPilot would pin older click and uvicorn here.)"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import typer
import yaml

from agentrl.cli import app

RECIPES = Path(__file__).resolve().parent.parent / "deploy" / "skypilot"
RECIPE = RECIPES / "gpu-backend.yaml"
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


def agentrl_commands(run: str) -> list[list[str]]:
    """Every `agentrl backend ...` the run script calls (directly or under torchrun), as words from "backend" on."""
    commands = []
    for line in run.replace("\\\n", " ").splitlines():
        words = shlex.split(re.sub(r"\$\(\(.*?\)\)", "N", line), comments=True)
        if "backend" in words and any(w.endswith(("bin/agentrl", "agentrl.cli")) for w in words):
            commands.append(words[words.index("backend") :])
    return commands


def test_the_multi_node_recipe_starts_a_head_and_joins_replicas_or_ranks_with_commands_that_exist():
    recipe = yaml.safe_load((RECIPES / "multi-node.yaml").read_text())
    assert set(recipe) <= TASK_FIELDS and set(recipe["resources"]) <= RESOURCES_FIELDS
    assert recipe["num_nodes"] >= 2
    assert recipe["secrets"] == {"AGENTRL_TOKEN": None, "AGENTRL_JOIN_TOKEN": None}  # both required
    syntax = subprocess.run(["bash", "-n"], input=recipe["run"], text=True, capture_output=True)
    assert syntax.returncode == 0, syntax.stderr
    for variable in ("SKYPILOT_NODE_RANK", "SKYPILOT_NODE_IPS", "SKYPILOT_NUM_NODES", "SKYPILOT_NUM_GPUS_PER_NODE"):
        assert f"${variable}" in recipe["run"] or f"{variable} " in recipe["run"], variable  # SkyPilot's node variables
    backend = typer.main.get_command(app).commands["backend"]  # type: ignore[attr-defined]
    commands = agentrl_commands(recipe["run"])
    assert sorted({c[1] for c in commands}) == ["rank", "replica", "serve"], commands
    for words in commands:
        options = {flag for param in backend.commands[words[1]].params for flag in param.opts}
        used = {word for word in words if word.startswith("--")}
        assert used <= options, (words[1], used - options)
    assert all("--rank-join" not in c or "--remote-ranks" in c for c in commands)  # a join point says how many join
