"""Every notebook runs top to bottom, tiny, on the real server and model (nbclient, a real kernel)."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
# Every cell runs, each loop once, on the smallest inputs that still exercise it: one group of two
# attempts (RULER still compares, GRPO still has a group), one held-out item, one demonstration.
TINY = {
    "AGENTRL_NB_STEPS": "1",
    "AGENTRL_NB_GROUPS": "1",
    "AGENTRL_NB_GROUP_SIZE": "2",
    "AGENTRL_NB_MAX_MOVES": "2",
    "AGENTRL_NB_TEST": "1",
    "AGENTRL_NB_SFT": "1",
    "AGENTRL_NB_RULER_STEPS": "1",
    "AGENTRL_NB_MAX_TURNS": "2",
    "AGENTRL_NB_CHECK_GROUPS": "1",
}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["2048", "email_agent", "ruler", "rubric", "mcp_rl"])
def test_notebook_runs_top_to_bottom(name, tmp_path, monkeypatch):
    for key, value in {**TINY, "AGENTRL_NB_BASE_PATH": str(tmp_path / "runs")}.items():
        monkeypatch.setenv(key, value)  # the kernel inherits the environment: the parameter cell reads it
    notebook = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    NotebookClient(
        notebook, timeout=840, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    if name != "ruler":  # the training notebooks show the reward plot and a transcript inline
        assert any("image/png" in o.get("data", {}) for o in outputs)
        assert any("text/html" in o.get("data", {}) and "trajectory 0" in o["data"]["text/html"] for o in outputs)
