"""The shipped environments are built on agentrl's public surface only, as a user's environment would be: every
agentrl name they import or reach is in the `__all__` of a public module (no server)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import agentrl

PUBLIC_MODULES = (
    "agentrl", "agentrl.judges", "agentrl.records", "agentrl.mcp", "agentrl.art", "agentrl.integrations",
    "agentrl.foundation.files", "agentrl.data.tool_calls", "agentrl.foundation.base_models",
)  # fmt: skip
"""Where an environment may take agentrl's names from (docs/environments.md)."""
ROOT = Path(__file__).resolve().parents[2] / "environments"


def _dotted(node: ast.Attribute) -> str | None:
    parts: list[str] = []
    current: ast.expr = node
    while isinstance(current, ast.Attribute):
        parts.append(current.attr)
        current = current.value
    return ".".join([current.id, *reversed(parts)]) if isinstance(current, ast.Name) else None


def uses(path: Path) -> list[tuple[str, str]]:
    """(module, name) for every agentrl name the file imports or reaches as `agentrl.module.name`."""
    found: list[tuple[str, str]] = []
    nodes = list(ast.walk(ast.parse(path.read_text())))
    inner = {id(n.value) for n in nodes if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute)}
    for node in nodes:
        if id(node) in inner:
            continue  # part of a longer chain, read whole below
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "agentrl":
            found += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(a.name, "") for a in node.names if a.name.split(".")[0] == "agentrl" and a.name != "agentrl"]
        elif isinstance(node, ast.Attribute) and (dotted := _dotted(node)) and dotted.startswith("agentrl."):
            parts = dotted.split(".")
            if parts[1] not in agentrl.__all__ and len(parts) >= 3:
                found.append((".".join(parts[:2]), parts[2]))
            elif parts[1] not in agentrl.__all__:
                found.append(("agentrl", parts[1]))
    return found


def test_the_environments_use_only_public_names():
    outside: list[str] = []
    files = sorted(ROOT.rglob("*.py"))
    assert len(files) > 20  # the environments were read
    for path in files:
        for module, name in uses(path):
            public = module in PUBLIC_MODULES and (
                not name or name in getattr(importlib.import_module(module), "__all__", ())
            )
            if not public:
                outside.append(
                    f"{path.relative_to(ROOT)}: {module}.{name}" if name else f"{path.relative_to(ROOT)}: {module}"
                )
    assert outside == []
