"""Run a notebook top to bottom at the sizes it is saved with, keep its outputs in the file (the docs site shows
them), and record how long it took on this machine: in benchmarks/results/notebooks.json and in the notebook's
opening cell, so a reader knows the wait before pressing run.

    .venv/bin/python scripts/render_notebook.py ruler [email_agent ...]
"""

from __future__ import annotations

import datetime
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agentrl.foundation.files import write_json_atomic, write_text_atomic  # noqa: E402
from benchmarks.step_breakdown import cpu_name, precision_label  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "notebooks.json"
WIDGET = "application/vnd.jupyter.widget-view+json"
MEASURED = re.compile(r"^\*Run as saved, .*$", re.MULTILINE)


def render(name: str) -> dict[str, object]:
    import nbformat
    from nbclient import NotebookClient

    path = ROOT / "notebooks" / f"{name}.ipynb"
    notebook = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory(prefix="agentrl-notebook-") as folder:
        started = time.perf_counter()
        NotebookClient(
            notebook, timeout=3600, kernel_name="python3", resources={"metadata": {"path": folder}}
        ).execute()
        seconds = time.perf_counter() - started
    commit = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    record = {
        "seconds": round(seconds),
        "kind": precision_label(),
        "cpu": cpu_name(),
        "commit": commit.stdout.strip(),
        "date": datetime.date.today().isoformat(),
    }
    line = (
        f"*Run as saved, it took {int(seconds) // 60} min {int(seconds) % 60} s on a 2-core {record['kind']} CPU "
        f"({record['cpu']}, {record['date']}); the outputs below are that run's.*"
    )
    for cell in notebook.cells:  # progress bars are live widgets: a saved page shows only their first frame
        if cell.cell_type == "code":
            cell.outputs = [o for o in cell.outputs if WIDGET not in o.get("data", {})]
    notebook.metadata.pop("widgets", None)
    opening = notebook.cells[0]
    opening.source = (
        MEASURED.sub(line, opening.source) if MEASURED.search(opening.source) else f"{opening.source}\n\n{line}"
    )
    write_text_atomic(path, nbformat.writes(notebook) + "\n")
    return record


def main() -> None:
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    for name in sys.argv[1:] or ["ruler"]:
        results[name] = render(name)
        write_json_atomic(RESULTS, results)
        print(f"{name}: {results[name]}")


if __name__ == "__main__":
    main()
