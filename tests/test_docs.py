"""The README and the documentation site cannot drift from the code: the site builds strictly, every Python block
compiles and names only what `agentrl` has (modules, attributes, keywords), every `agentrl ...` command shown
parses, and every repository file the pages name exists. No server: these run in the fast tier."""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
ROOTS = ("agentrl", "agentrl_environments")
"""Packages whose names a block must spell as they are."""


def blocks(language: str) -> list[tuple[str, str]]:
    """(where, source) of every fenced block in `language` in the README and the docs pages."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in FENCE.finditer(text):
            if match.group(1) == language:
                line = text[: match.start()].count("\n") + 1
                found.append((f"{page.relative_to(ROOT)}:{line}", match.group(2)))
    return found


def test_the_readme_is_a_front_page_with_the_two_commands_and_a_rollout_on_its_first_screen():
    lines = README.read_text().splitlines()
    assert len(lines) <= 250
    first_screen = "\n".join(lines[:60])
    assert "bash scripts/setup.sh && .venv/bin/agentrl train larger-number" in first_screen
    assert "bash scripts/setup.sh --dev && .venv/bin/python -m pytest" in first_screen
    assert "async def rollout(" in first_screen
    ci = (ROOT / ".ci" / "run").read_text()
    test_command = next(line for line in lines if "python -m pytest" in line).split("#")[0].strip()
    assert test_command.removeprefix("bash scripts/setup.sh --dev && ") in ci  # CI runs the README's command


def test_the_site_builds_strictly(tmp_path):
    """`mkdocs build --strict`: a broken link, a missing page or an unresolved API reference fails the build."""
    pytest.importorskip("mkdocs", reason="the docs extra (scripts/setup.sh --dev) is not installed")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for page in ("index.html", "judges/index.html", "api/index.html", "notebooks/ruler/index.html"):
        assert (tmp_path / "site" / page).is_file(), page
    assert "ruler_score_group" in (tmp_path / "site" / "api" / "index.html").read_text()


class _Names(ast.NodeVisitor):
    """The `agentrl` names a block uses: its imports, attribute chains and calls, resolved against the package."""

    def __init__(self) -> None:
        self.bound: dict[str, str] = {}  # local name -> dotted path
        self.problems: list[str] = []

    def resolve(self, dotted: str) -> Any:
        parts = dotted.split(".")
        obj: Any = importlib.import_module(parts[0])
        for index, part in enumerate(parts[1:], start=1):
            if hasattr(obj, part):
                obj = getattr(obj, part)
                continue
            try:
                obj = importlib.import_module(".".join(parts[: index + 1]))
            except ModuleNotFoundError as error:
                raise AttributeError(f"{'.'.join(parts[:index])} has no {part!r}") from error
        return obj

    def check(self, dotted: str, node: ast.AST) -> Any:
        try:
            return self.resolve(dotted)
        except (AttributeError, ImportError) as error:
            self.problems.append(f"line {getattr(node, 'lineno', '?')}: {dotted}: {error}")
            return None

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name.split(".")[0] in ROOTS:
                self.check(alias.name, node)
                self.bound[alias.asname or alias.name.split(".")[0]] = (
                    alias.asname and alias.name or alias.name.split(".")[0]
                )

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module and node.module.split(".")[0] in ROOTS:
            for alias in node.names:
                self.check(f"{node.module}.{alias.name}", node)
                self.bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def dotted(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return self.bound.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.dotted(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    def visit_Attribute(self, node: ast.Attribute) -> None:
        dotted = self.dotted(node)
        if dotted is not None and not isinstance(node.ctx, ast.Store):
            self.check(dotted, node)
        else:
            self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        dotted = self.dotted(node.func)
        target = self.check(dotted, node) if dotted else None
        keywords = [k.arg for k in node.keywords if k.arg is not None]
        if target is not None and keywords and callable(target):
            try:
                signature = inspect.signature(target)
            except (TypeError, ValueError):
                signature = None
            if signature is not None and not any(
                p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values()
            ):
                unknown = [k for k in keywords if k not in signature.parameters]
                if unknown:
                    self.problems.append(f"line {node.lineno}: {dotted}() takes no {unknown}")
        for argument in [*node.args, *(k.value for k in node.keywords)]:
            self.visit(argument)
        if not isinstance(node.func, ast.Name) and dotted is None:
            self.visit(node.func)


@pytest.mark.parametrize(("where", "source"), blocks("python"), ids=lambda value: value if ":" in value else "")
def test_every_python_block_compiles_and_names_only_what_agentrl_has(where, source):
    tree = compile(source, where, "exec", flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    names = _Names()
    names.visit(tree)
    assert not names.problems, f"{where}: {names.problems}"


def agentrl_commands() -> list[tuple[str, list[str]]]:
    """(where, arguments) of every `agentrl ...` command in the pages' bash blocks."""
    found = []
    for where, source in blocks("bash"):
        for line in source.replace("\\\n", " ").splitlines():
            for part in re.split(r"&&|\|\||;|\|", line.split(" #")[0]):
                words = shlex.split(part, comments=True)
                if words and words[0] in ("agentrl", ".venv/bin/agentrl"):
                    found.append((where, words[1:]))
    return found


@pytest.mark.parametrize(
    ("where", "arguments"), agentrl_commands(), ids=lambda value: " ".join(value) if isinstance(value, list) else ""
)
def test_every_agentrl_command_shown_parses(where, arguments):
    import typer

    from agentrl.cli import app

    command: Any = typer.main.get_command(app)
    names = ["agentrl"]
    rest = list(arguments)
    while hasattr(command, "commands") and rest and not rest[0].startswith("-"):  # a group: its subcommand
        sub = command.commands.get(rest[0])
        assert sub is not None, f"{where}: agentrl has no command {' '.join([*names[1:], rest[0]])!r}"
        names.append(rest.pop(0))
        command = sub
    try:
        command.make_context(" ".join(names), list(rest))  # click consumes the list it parses
    except Exception as error:  # noqa: BLE001 - typer vendors click: its errors are not `click`'s classes
        if type(error).__name__ != "Exit":  # --help exits
            pytest.fail(f"{where}: `{' '.join(names + rest)}` does not parse: {error}")


REPO_PATH = re.compile(
    r"`((?:agentrl|agentrl_vllm|environments|benchmarks|scripts|tests|notebooks|docs|\.ci)/[\w./-]*)`"
)
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_every_repository_file_the_pages_name_exists():
    missing = []
    for page in PAGES:
        text = page.read_text()
        for path in REPO_PATH.findall(text):
            if not (ROOT / path.rstrip("/")).exists():
                missing.append(f"{page.relative_to(ROOT)}: {path}")
        for link in LINK.findall(text):
            if "://" in link:
                continue
            if not (page.parent / link).exists():
                missing.append(f"{page.relative_to(ROOT)}: link {link}")
    assert not missing
