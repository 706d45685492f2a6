"""`-n 2 --dist loadgroup`: the fast tests run on both pytest-xdist workers first, then the slow tests all on one.

One worker holds the session's vLLM server and zygote (two workers each with their own left 0.2 GB of 24 GB
free), and the slow tests run alone (LATER_GROUP says why). pytest-xdist's loadgroup reads a test's group from
a suffix it writes onto the node id, which pytest 9.2 no longer takes (pytest-dev/pytest-xdist#1386: the groups
are silently ignored), so each worker writes the groups it collected to a file and the controller's scheduler
reads them there. conftest.py registers this module as a plugin."""

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from agentrl.foundation.files import write_json_atomic

GROUPS_ENV = "AGENTRL_TEST_GROUPS"
"""The folder where workers write their tests' groups: set by the controller, inherited by its workers."""


LATER_GROUP = "slow"
"""Dealt out after every other test, so the fast tier runs on both workers first and the slow tests then run
alone: beside other work their server's and trainer's two-thread OpenMP teams stall (docs/testing.md, Targets,
has the measurements)."""


def _loadgroup(config: pytest.Config) -> bool:
    return config.getoption("dist", default="no") == "loadgroup"


def is_worker(config: pytest.Config) -> bool:
    """This process is a pytest-xdist worker (by its config: a nested pytest inherits its environment)."""
    return hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    if _loadgroup(config) and not is_worker(config):  # the controller, before it starts its workers
        os.environ[GROUPS_ENV] = tempfile.mkdtemp(prefix="agentrl-groups-")


def pytest_unconfigure(config: pytest.Config) -> None:
    if _loadgroup(config) and not is_worker(config) and GROUPS_ENV in os.environ:
        shutil.rmtree(os.environ.pop(GROUPS_ENV), ignore_errors=True)


def _group(item: pytest.Item) -> str | None:
    names = sorted(
        {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")}
    )
    return "_".join(names) or None


@pytest.hookimpl(trylast=True)  # after conftest.py has marked the slow tests
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    folder = os.environ.get(GROUPS_ENV)
    if folder and is_worker(config):  # set by a controller under loadgroup (a worker's own `dist` says "no")
        groups = {item.nodeid: group for item in items if (group := _group(item))}
        write_json_atomic(Path(folder) / f"{config.workerinput['workerid']}.json", groups)


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):  # noqa: ANN001, ANN201 - xdist's types
    if not _loadgroup(config):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupsFromWorkers(LoadScopeScheduling):
        """xdist's loadgroup, with each test's group read from what the workers wrote at collection."""

        _groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._groups is None:  # scheduling starts once every worker has collected (and written)
                self._groups = {}
                for path in Path(os.environ[GROUPS_ENV]).glob("*.json"):
                    self._groups.update(json.loads(path.read_text()))
            return self._groups.get(nodeid, nodeid)

        def _assign_work_unit(self, node):  # noqa: ANN001, ANN202 - xdist's types
            # The slow group goes last, once the fast tier is dealt out (LATER_GROUP).
            if LATER_GROUP in self.workqueue and len(self.workqueue) > 1:
                self.workqueue.move_to_end(LATER_GROUP)
            super()._assign_work_unit(node)

    return GroupsFromWorkers(config, log)
