"""The package's shape: no import cycle in agentrl/, the library never imports the recipes, and
`TrainableModel` works against any `Backend` (here a fake one; the real one is tested everywhere else)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import agentrl
from agentrl.foundation.endpoint import InferenceEndpoint

PACKAGE = Path(agentrl.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def runtime_imports(path: Path, *, type_checking: bool = False) -> set[str]:
    """Modules `path` imports when it runs (anywhere in it, functions included); with `type_checking`, also
    those it imports only for the type checker (under TYPE_CHECKING)."""
    tree = ast.parse(path.read_text())
    skipped = {
        id(node)
        for block in ast.walk(tree)
        if not type_checking and isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for stmt in block.body
        for node in ast.walk(stmt)
    }
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}  # `from pkg import module`
    return found


def import_graph(*, type_checking: bool = False) -> dict[str, set[str]]:
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {
        name: {m for m in runtime_imports(path, type_checking=type_checking) if m in files and m != name}
        for name, path in files.items()
    }


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node], _ = "open", stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node], _ = "done", stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_agentrl_has_no_import_cycle_not_even_through_type_checking_imports():
    graph = import_graph(type_checking=True)
    assert "agentrl.client.model" in graph and "agentrl.backend.local" in graph
    assert "agentrl.client.model" in graph["agentrl.backend.local"]  # the backend depends on the model ...
    assert not any(
        m.startswith("agentrl.backend.") for m in graph["agentrl.client.model"] - {"agentrl.foundation.endpoint"}
    )
    assert (
        "agentrl.data.trajectory" in graph["agentrl.client.capture"]
        and "agentrl.client.model" not in graph["agentrl.client.capture"]
    )
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))
    assert (
        import_graph()["agentrl.client.rollout_session"] < graph["agentrl.client.rollout_session"]
    )  # TYPE_CHECKING imports count here only


LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundation", ("agentrl.foundation",)),
    ("gateway", ("agentrl.gateway",)),
    ("data", ("agentrl.data",)),
    ("pure RL", ("agentrl.rl",)),
    ("records", ("agentrl.records",)),
    ("client", ("agentrl.client", "agentrl.judges")),
    ("backend", ("agentrl.backend",)),
    (
        "on top",
        ("agentrl.art", "agentrl.mcp", "agentrl.integrations", "agentrl.judge_training", "agentrl.cli", "agentrl.templates",
         "agentrl"),
    ),
]  # fmt: skip
"""The package's floors, lowest first (docs/architecture.md): a module imports its own floor or those below."""


def layer_of(module: str) -> int:
    """The floor of `module`: the one whose longest name is a prefix of it (`agentrl` alone is the top)."""
    matches = [
        (len(prefix), floor)
        for floor, (_, prefixes) in enumerate(LAYERS)
        for prefix in prefixes
        if module == prefix or module.startswith(prefix + ".")
    ]
    assert matches, f"{module} is on no floor: add it to LAYERS in tests/test_architecture.py and docs/architecture.md"
    return max(matches)[1]


def test_every_import_points_down_the_layers_type_checking_imports_included():
    graph = import_graph(type_checking=True)
    upward = sorted(
        f"{module} ({LAYERS[layer_of(module)][0]}) -> {imported} ({LAYERS[layer_of(imported)][0]})"
        for module, imports in graph.items()
        for imported in imports
        if layer_of(imported) > layer_of(module)
    )
    assert upward == []
    assert layer_of("agentrl.gateway.app") < layer_of("agentrl.data.trajectory") < layer_of("agentrl.records.tracking")
    assert layer_of("agentrl") == len(LAYERS) - 1 and layer_of("agentrl.backend.training.trainer") == 6


def test_the_backends_rooms_import_downward_and_the_remote_client_needs_no_local_backend():
    graph = import_graph(type_checking=True)
    shared = {f"agentrl.backend.{name}" for name in ("precision", "processes", "run_lock")}
    rooms = {"training", "serving", "remote"}
    for module, imported in graph.items():
        room = module.split(".")[2] if module.startswith("agentrl.backend.") else None
        backend_imports = {m for m in imported if m.startswith("agentrl.backend.")}
        if room in ("training", "serving"):  # the engine's parts use each other's room or shared helpers only
            assert all(m.startswith(f"agentrl.backend.{room}") or m in shared for m in backend_imports), module
        if module == "agentrl.backend.remote.client" or module == "agentrl.backend.remote.wire":
            assert backend_imports <= {"agentrl.backend.remote.wire", "agentrl.foundation.endpoint"}, module
    assert rooms <= {m.split(".")[2] for m in graph if m.count(".") >= 3 and m.startswith("agentrl.backend.")}


def test_the_cycle_check_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


MAX_MODULE_LINES = 400
"""A module longer than this holds more than one job: split it by job, not by line count."""


def test_no_module_in_agentrl_is_over_the_line_limit():
    lengths = {str(p.relative_to(PACKAGE.parent)): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    assert len(lengths) > 100  # the whole package was read
    assert {path: n for path, n in lengths.items() if n > MAX_MODULE_LINES} == {}


def test_the_library_never_imports_the_recipes():
    for path in PACKAGE.rglob("*.py"):
        imported = runtime_imports(path)
        assert not any(m.split(".")[0] in ("agentrl_environments", "environments") for m in imported), path
        assert "agentrl_environments." not in path.read_text(), path  # nor by string


def test_the_code_that_runs_inside_vllm_imports_nothing_of_agentrl_and_the_guard_only_the_standard_library():
    import sys

    vllm_side = PACKAGE.parent / "agentrl_vllm"
    for path in vllm_side.rglob("*.py"):
        assert not any(m.split(".")[0] == "agentrl" for m in runtime_imports(path)), path
    guard = runtime_imports(vllm_side / "server_guard.py")
    assert {m.split(".")[0] for m in guard} <= sys.stdlib_module_names | {"__future__"}, guard


def test_the_wheel_lists_every_package_and_installs_the_environments_under_their_own_name():
    import tomllib

    setuptools = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {"agentrl": "agentrl", "agentrl_vllm": "agentrl_vllm", "agentrl_environments": "environments"}
    assert setuptools["package-dir"] == {"agentrl_environments": "environments"}
    found = set()
    for name, folder in folders.items():
        for init in (PACKAGE.parent / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(PACKAGE.parent / folder).parts
            found.add(".".join((name, *parts)))
    data_folders = set(setuptools["package-data"]) - found  # folders of files only (templates, task data)
    for name in data_folders:
        top, *parts = name.split(".")
        folder = PACKAGE.parent.joinpath(folders[top], *parts)
        assert folder.is_dir() and not list(folder.glob("*.py")), f"package-data {name}: a folder of data files"
    assert found | data_folders == set(setuptools["packages"]), (
        "pyproject.toml's [tool.setuptools] packages: add or drop these"
    )
    import agentrl_environments.email_agent

    assert Path(agentrl_environments.email_agent.__file__).parent == PACKAGE.parent / "environments" / "email_agent"


def test_the_shipped_environments_are_found_through_entry_points():
    from agentrl.foundation.plugins import environment_names, load_environment

    assert {"2048", "email", "larger-number"} <= set(environment_names())
    assert load_environment("email").rewards == ("match", "judge", "ruler")
    assert load_environment("2048").default_name == "2048-agent"


class FakeBackend:
    """A `Backend` that records calls: enough to unit-test `TrainableModel` without a server."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.step = 3

    async def register(self, model):
        self.calls.append(("register", model.name))
        return self.step

    async def get_step(self, model):
        return self.step

    async def train(self, model, groups, config, *, step_metrics=None, dropped=()):
        self.calls.append(("train", len(groups), config.learning_rate))
        self.step += 1
        return agentrl.TrainResult(step=self.step, metrics={"reward_mean": 0.5})

    async def train_sft(self, model, histories, config):
        self.calls.append(("train_sft", len(histories), config.epochs))
        self.step += 1
        return agentrl.TrainResult(step=self.step)

    async def log(self, model, groups, split):
        self.calls.append(("log", [len(g.trajectories) for g in groups], split))
        return {"reward_mean": 1.0}

    async def delete_checkpoints(self, model, *, keep_last, best_by):
        self.calls.append(("delete", keep_last, best_by))
        return [1]

    def endpoint(self, model):
        return InferenceEndpoint("http://127.0.0.1:9/v1", "fake-key")

    def base_model(self):
        return agentrl.Model(name="base", base_url="http://127.0.0.1:9/v1", api_key="fake-key")

    async def close(self):
        self.calls.append(("close",))


async def test_trainable_model_against_a_fake_backend():
    backend = FakeBackend()
    assert isinstance(backend, agentrl.Backend)
    model = agentrl.TrainableModel(name="agent", project="unit")
    assert not model.registered
    await model.register(backend)
    assert model.registered and model.backend is backend and model.inference_name == "agent@3"
    client = model.openai_client()
    assert str(client.base_url) == "http://127.0.0.1:9/v1/" and client.api_key == "fake-key"
    assert model.litellm_params() == {
        "model": "hosted_vllm/agent@3",
        "api_base": "http://127.0.0.1:9/v1",
        "api_key": "fake-key",
    }
    result = await model.train([agentrl.TrajectoryGroup()])
    assert result.step == 4 and model.inference_name == "agent@4"
    assert backend.calls[-1] == ("train", 1, agentrl.TrainConfig().learning_rate)  # the default config
    await model.train_sft([agentrl.Trajectory()], agentrl.SFTConfig(epochs=1))
    assert model.inference_name == "agent@5" and backend.calls[-1] == ("train_sft", 1, 1)
    assert await model.log([agentrl.Trajectory(), agentrl.Trajectory()]) == {"reward_mean": 1.0}
    assert backend.calls[-1] == ("log", [1, 1], "val")  # each trajectory its own group
    assert await model.delete_checkpoints() == [1]
    assert backend.calls[-1] == ("delete", 1, "val/reward_mean")  # ART's default: keep the best held-out
    backend.step = 9
    assert await model.get_step() == 9 and model.inference_name == "agent@9"


def test_a_model_without_a_backend_says_how_to_get_one():
    import pytest

    with pytest.raises(agentrl.AgentRLError, match="register"):
        agentrl.TrainableModel(name="agent").litellm_params()


def test_test_modules_share_builders_through_helpers_never_through_each_other():
    tests = PACKAGE.parent / "tests"
    for path in tests.rglob("*.py"):
        borrowed = {m for m in runtime_imports(path) if m.startswith("tests.") and m.split(".")[-1].startswith("test_")}
        assert not borrowed, f"{path.name} imports from {sorted(borrowed)}: move what it shares into tests/helpers.py"


def test_the_tests_mirror_the_package():
    """Each of agentrl's packages and the backend's rooms has its tests in the same place under tests/
    (agentrl/backend/training -> tests/backend/training); tests of agentrl's own modules sit in tests/ itself, and tests/behaviour holds
    what crosses the layers (security, bad input, faults, kill trials, the closed loop, the notebooks)."""
    tests = PACKAGE.parent / "tests"
    packages = {p.parent.relative_to(PACKAGE) for p in PACKAGE.rglob("*.py") if p.parent != PACKAGE}
    packages = {p for p in packages if len(p.parts) == 1 or p.parts[0] == "backend"}  # art/ mirrors ART's own
    missing = sorted(str(p) for p in packages if not list((tests / p).glob("test_*.py")))
    assert missing == [], f"add tests/{missing[0]}/ with the tests of agentrl/{missing[0]}/"
    folders = {p.parent.relative_to(tests) for p in tests.rglob("test_*.py") if p.parent != tests}
    assert folders - packages == {Path("behaviour"), Path("environments")}, "a test folder no package has"
    assert all((tests / folder / "__init__.py").exists() for folder in folders)  # unique module names


def test_the_lazily_loaded_names_are_listed_once_and_typed_where_they_load():
    """The lazily loaded names are the public names (`__all__`) the imports do not define; the TYPE_CHECKING
    imports give each its type from the module it loads from."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    typed = {
        alias.asname: node.module
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    lazy = dict(agentrl._LAZY)
    assert typed == {name: "agentrl.judges.ruler" if name == "ruler" else module for name, module in lazy.items()}
    assert set(lazy) <= set(agentrl.__all__) and len(agentrl.__all__) == len(set(agentrl.__all__))


def test_the_judges_raise_agentrls_typed_errors_not_bare_value_errors():
    """Bad input to a judge is a `ConfigurationError` (a ValueError too) naming the fix; only pydantic's own
    validation hooks raise a plain ValueError, which pydantic turns into its ValidationError."""
    bare = []
    for path in (PACKAGE / "judges").rglob("*.py"):
        for function in ast.walk(ast.parse(path.read_text())):
            if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef) and function.name != "model_post_init":
                for node in ast.walk(function):
                    if isinstance(node, ast.Raise) and node.exc is not None and "ValueError(" in ast.unparse(node.exc):
                        bare.append(f"{path.name}:{node.lineno} in {function.name}")
    assert bare == []


def test_one_training_loop_steps_a_model():
    """Only the training loop (`pipeline.py`) steps a model: the environments, MCP-RL and judge RL run on it, not on a
    loop of their own. The model hands its step to the backend, a backend service to its backend, and ART's API is
    ART's own calls mapped onto agentrl's."""
    allowed = {"agentrl.client.pipeline", "agentrl.client.model", "agentrl.backend.remote.service"}
    callers = set()
    for path in [*PACKAGE.rglob("*.py"), *(PACKAGE.parent / "environments").rglob("*.py")]:
        name = module_name(path) if path.is_relative_to(PACKAGE) else f"environments.{path.stem}"
        for node in ast.walk(ast.parse(path.read_text())):
            call = node.value if isinstance(node, ast.Await) else None
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "train":
                callers.add(name)
    assert {c for c in callers if not c.startswith("agentrl.art.")} == allowed


ARCHITECTURE_PAGE = PACKAGE.parent / "docs" / "architecture.md"


def test_every_module_is_named_on_the_architecture_page():
    """docs/architecture.md is the newcomer's map: a module it does not name is one the map hides."""
    page = ARCHITECTURE_PAGE.read_text()
    modules = [p for root in ("agentrl", "agentrl_vllm") for p in (PACKAGE.parent / root).rglob("*.py")]
    assert len(modules) > 150  # both packages were read
    unnamed = [
        str(p.relative_to(PACKAGE.parent))
        for p in modules
        if p.name != "__init__.py" and not re.search(r"(?<![\w.])" + re.escape(p.name), page)
    ]
    assert unnamed == [], "name these in docs/architecture.md's layout: " + ", ".join(sorted(unnamed))


def test_the_recipes_import_no_internal_module_but_those_the_architecture_page_names():
    """The recipes use the public API (agentrl and its public subpackages) and the internal modules the
    architecture page's recipes row lists, no others: a recipe that reaches deeper shows it on that page."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    internal = {name for name, path in modules.items() if path.name != "__init__.py"}
    imported = {
        m for path in (PACKAGE.parent / "environments").rglob("*.py") for m in runtime_imports(path) if m in internal
    }
    row = next(line for line in ARCHITECTURE_PAGE.read_text().splitlines() if line.startswith("| recipes |"))
    named = set(re.findall(r"`(agentrl\.[\w.]+)`", row)) & internal
    assert imported == named, (
        f"imported but not named: {sorted(imported - named)}; named, not imported: {sorted(named - imported)}"
    )
