"""The benchmark tables of README and the docs pages: every figure names its machine's kind (bf16 or float32, which
sets its speed), and the tables re-rendered from their committed results files are the ones the pages hold."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from benchmarks import debiased_ruler, judge_latency, judge_training, main_job, pipeline_spread, sampling, shared_prefix
from benchmarks.readme import PAGES
from benchmarks.step_breakdown import AVX2_ONLY_ENV, machine_label, precision_label

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
ALL_PAGES = "\n".join(page.read_text() for page in PAGES)
RESULTS = ROOT / "benchmarks" / "results"
SECTION = re.compile(r"<!-- (benchmark:[a-z_-]+|judge-check):start -->(.*?)<!-- \1:end -->", re.S)


CPU = re.compile(r"(?:AMD )?EPYC|Intel(?:\(R\))? Xeon(?:\(R\) Processor)?")
KIND_BEFORE = re.compile(r"(?:bf16|float32)(?::| numerics on the bf16)? $")
KIND_AFTER = re.compile(r" \((?:bf16|float32)")


def kind_named(line: str, cpu: re.Match[str]) -> bool:
    """Whether this mention of a CPU carries its kind: "bf16: AMD EPYC", "float32 AMD EPYC", "Intel Xeon (bf16)",
    or a caption that opens with its kind in bold (compare_trl's)."""
    return bool(
        KIND_BEFORE.search(line[: cpu.start()])
        or KIND_AFTER.match(line, cpu.end())
        or re.match(r"\*\*(?:bf16|float32)\*\*", line)
    )


def test_every_cpu_a_results_table_names_comes_with_its_kind():
    sections = SECTION.findall(ALL_PAGES)
    assert len(sections) >= 15
    unnamed = [
        f"{name}: {line}"
        for name, body in sections
        for line in body.splitlines()
        for cpu in CPU.finditer(line)
        if not kind_named(line, cpu)
    ]
    assert not unnamed


@pytest.mark.parametrize(
    ("results_file", "render"),
    [
        ("sampling.json", sampling.readme_table),
        ("debiased_ruler.json", debiased_ruler.table),
        ("judge_training.json", judge_training.table),
        ("judge_training.json", judge_training.diagnosis_table),
        ("judge_latency.json", judge_latency.table),
        ("shared_prefix.json", shared_prefix.table),
        ("pipeline_spread.json", pipeline_spread.spread_table),
    ],
)
def test_a_table_rendered_from_its_results_file_is_the_one_the_pages_hold(results_file, render):
    assert render(json.loads((RESULTS / results_file).read_text())) in ALL_PAGES


def test_the_readmes_judge_table_is_rendered_from_the_judge_and_learning_results():
    judges = json.loads((RESULTS / "judge_training.json").read_text())
    assert judge_training.headline(judges, json.loads((RESULTS / "learning.json").read_text())) in README


def test_the_readmes_headline_and_the_main_job_history_are_rendered_from_its_results():
    runs = json.loads((RESULTS / "main_job.json").read_text())["runs"]
    assert main_job.headline(runs) in README  # the newest fresh-clone run of each machine kind
    assert {r["kind"] for r in main_job.latest_per_kind(runs)} == {"bf16", "float32"}
    assert main_job.history(runs) in (ROOT / "docs" / "benchmarks.md").read_text()
    assert main_job.held_out("held-out at step 0: reward_mean 0.250, x 1\nheld-out at step 20: reward_mean 0.980") == (
        0.25,
        0.98,
    )


def test_the_machine_label_names_the_kind_and_a_run_under_avx2_caps(monkeypatch):
    monkeypatch.delenv(AVX2_ONLY_ENV, raising=False)
    plain = machine_label()
    assert plain.startswith(f"{precision_label()}: ") and "avx2_only" not in plain
    monkeypatch.setenv(AVX2_ONLY_ENV, "1")  # as scripts/avx2_only.sh sets it
    assert "under scripts/avx2_only.sh (AVX2 caps)" in machine_label()


def test_the_history_plots_read_every_recorded_run():
    from benchmarks import history

    adapter = history.adapter_ratios()
    rows = json.loads((RESULTS / "sampling.json").read_text()).values()
    assert len(adapter) == sum("adapter_vs_base_c32" in row for row in rows)
    latest = json.loads((RESULTS / "compare_trl.json").read_text())
    trl = history.trl_ratios()
    assert {(e["date"], e["speedup_median"]) for e in latest.values()} <= {(d, r) for d, _, r in trl}
    assert {kind for _, kind, _ in [*adapter, *trl]} <= {"bf16", "float32", "kind not recorded"}


def test_the_front_page_figure_and_transcript_are_the_recorded_main_job_runs():
    """README's plot and before/after answers come from one recorded run: the image's bytes are the run's own
    reward.png (its sha256 in main_job.json) and the transcript is rendered from that entry."""
    import hashlib

    run = main_job.figure_run(json.loads((RESULTS / "main_job.json").read_text())["runs"])
    assert run is not None, "no main-job run recorded a figure: .venv/bin/python -m benchmarks.main_job"
    assert hashlib.sha256(main_job.FIGURE.read_bytes()).hexdigest() == run["figure"]["reward_plot_sha256"]
    assert main_job.transcript(run) in README
    assert "](docs/images/main-job-reward.png)" in README
    assert "](images/main-job-reward.png)" in (ROOT / "docs" / "index.md").read_text()
