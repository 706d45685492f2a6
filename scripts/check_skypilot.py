"""Validate deploy/skypilot/*.yaml with SkyPilot's own parser, launching nothing.

    python3 -m venv /tmp/sky && /tmp/sky/bin/pip install skypilot==0.14.1
    /tmp/sky/bin/python scripts/check_skypilot.py

SkyPilot is not an agentrl dependency (it would pin older click and uvicorn into the environment),
so this runs in a throwaway virtualenv. Checks each task against SkyPilot's task schema and builds
the `sky.Task` with the required secret given, as `sky launch --secret AGENTRL_TOKEN` would; the
accelerator names are checked against the cloud catalogs only by `sky launch` (they need a network).
Last run: skypilot 0.14.1, 2026-11-27, passed (gpu-backend.yaml; multi-node.yaml, 2 nodes).
"""

from __future__ import annotations

import sys
from pathlib import Path

import sky
import yaml
from sky.utils import common_utils, schemas

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    print(f"skypilot {sky.__version__}")
    for path in sorted((ROOT / "deploy" / "skypilot").glob("*.yaml")):
        config = yaml.safe_load(path.read_text())
        common_utils.validate_schema(config, schemas.get_task_schema(), f"{path.name}: invalid task YAML: ")
        secrets = [(name, "check") for name in (config.get("secrets") or {})]
        task = sky.Task.from_yaml_config(config, secrets_overrides=secrets)
        print(
            f"{path.relative_to(ROOT)}: valid; {task.num_nodes} node(s); resources {sorted(map(str, task.resources))}; "
            f"secrets {sorted(task.secrets)}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
