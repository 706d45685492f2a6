"""The test command's `-n 2 --dist loadgroup` keeps a group's tests on one worker, and deals the slow group out
last (tests/xdist_groups.py)."""

import re
import subprocess
import sys
import textwrap
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent.parent


def test_a_groups_tests_run_on_one_worker_the_others_beside_them_and_the_slow_group_last(tmp_path):
    (tmp_path / "test_mixed.py").write_text(
        textwrap.dedent(
            """
            import os, time
            import pytest

            def started(name):
                with open(os.path.join(os.path.dirname(__file__), "started.txt"), "a") as f:
                    f.write(name + "\\n")

            @pytest.mark.parametrize("k", range(4))
            @pytest.mark.xdist_group("slow")
            def test_grouped(k):
                started("grouped")
                time.sleep(0.2)

            @pytest.mark.parametrize("k", range(8))
            def test_free(k):
                started("free")
                time.sleep(0.2)
            """
        )
    )
    command = [sys.executable, "-m", "pytest", "-p", "tests.xdist_groups", "-p", "no:cacheprovider", "-n", "2"]
    command += ["--dist", "loadgroup", "-v", "--rootdir", str(tmp_path), str(tmp_path)]
    result = subprocess.run(command, cwd=REPOSITORY, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    ran_on = {test: worker for worker, test in re.findall(r"\[(gw\d)\] .*PASSED \S*::(test_\w+\[\d\])", result.stdout)}
    assert len(ran_on) == 12, result.stdout
    grouped = {worker for test, worker in ran_on.items() if test.startswith("test_grouped")}
    assert len(grouped) == 1, f"the group was split across workers: {ran_on}"
    assert any(worker not in grouped for worker in ran_on.values()), f"nothing ran beside the group: {ran_on}"
    # The slow group is dealt out last (LATER_GROUP): it starts once the free tests are dealt, each worker
    # holding at most three of them then (xdist keeps two or three queued on each).
    order = (tmp_path / "started.txt").read_text().split()
    assert order.index("grouped") >= 8 - 3, order
