"""Run tracking: trajectories reload, transcripts escape and show everything, the plot is drawn, writes are atomic."""

import json
import subprocess
import sys
from pathlib import Path

from agentrl import Trajectory, TrajectoryGroup
from agentrl.records.step_metrics import summarize
from agentrl.records.tracking import load_trajectories, plot_rewards, read_metrics, record_step, transcript_html
from tests.helpers import sample_groups

ROOT = Path(__file__).resolve().parents[2]


def test_a_step_leaves_metrics_trajectories_transcript_and_plot(tmp_path):
    groups = sample_groups()
    record_step(tmp_path, 1, "train", groups, {"reward_mean": 0.5, "loss": 0.1})
    record_step(tmp_path, 1, "val", groups, summarize(groups[0].trajectories))
    record_step(tmp_path, 2, "train", groups, {"reward_mean": 0.7})
    assert [(m["step"], m["split"]) for m in read_metrics(tmp_path)] == [(1, "train"), (1, "val"), (2, "train")]
    reloaded = load_trajectories(tmp_path / "trajectories" / "train-0001.jsonl")
    assert reloaded[0].trajectories == groups[0].trajectories  # Choices, token ids and all
    page = (tmp_path / "transcripts" / "train-0002.html").read_text()
    assert "&lt;b&gt;invoice&lt;/b&gt;" in page and "<b>invoice</b>" not in page  # content is escaped
    assert "search_emails" in page and "$525" in page and "RULER: found it" in page and "reward 1.000" in page
    png = (tmp_path / "reward.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    assert not list(tmp_path.rglob("*.tmp"))  # no temporary files left behind


def test_summarize_averages_reward_and_metrics():
    summary = summarize(sample_groups()[0].trajectories)
    assert summary["reward_mean"] == 0.5 and summary["turns"] == 1.5 and summary["num_trajectories"] == 2


def test_plot_with_no_metrics_yet_is_an_empty_chart_not_an_error(tmp_path):
    path = plot_rewards(tmp_path)  # a run folder before its first step: no metrics.jsonl
    assert path == tmp_path / "reward.png" and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (tmp_path / "metrics.jsonl").exists() and not list(tmp_path.rglob("*.tmp"))


def test_transcript_shows_additional_histories_and_exceptions():
    from agentrl import History, RolloutException

    traj = Trajectory(
        messages_and_choices=[{"role": "user", "content": "main"}],
        additional_histories=[History(messages_and_choices=[{"role": "user", "content": "branch"}])],
    )
    group = TrajectoryGroup([traj], exceptions=[RolloutException(type="TimeoutError", message="judge slow")])
    page = transcript_html([group], "t")
    assert "additional history 1" in page and "branch" in page and "TimeoutError: judge slow" in page
    json.loads(json.dumps(page))  # a plain string


def test_a_step_where_the_judge_rises_and_the_independent_reward_falls_is_flagged(tmp_path, caplog):
    from agentrl.records.tracking import reward_hacking_steps

    steps = [(1, 0.40, 0.50), (2, 0.50, 0.60), (3, 0.70, 0.40), (4, 0.705, 0.30), (5, 0.60, 0.20)]
    with caplog.at_level("WARNING", logger="agentrl.records.tracking"):
        for step, judged, independent in steps:
            record_step(tmp_path, step, "train", [], {"reward_mean": judged, "independent_reward": independent})
    records = read_metrics(tmp_path)
    # step 3: judge +0.2, independent -0.2; step 4: judge +0.005 is noise; step 5: both fell
    assert reward_hacking_steps(records) == [3]
    flagged = [r.message.split(":")[0] for r in caplog.records if r.name == "agentrl.records.tracking"]
    assert flagged == ["step 3"]  # caplog sees every logger: another test's asyncio noise is not ours
    assert (tmp_path / "reward.png").stat().st_size > 0
    # a skipped step (nothing trained) is no step of the policy's; val records never flag; nor does a run without a judge
    assert reward_hacking_steps([*records, {**records[2], "step": 6, "reward_mean": 0.9, "skipped": True}]) == [3]
    assert reward_hacking_steps([{**r, "split": "val"} for r in records]) == []
    assert reward_hacking_steps([{"step": 1, "split": "train", "reward_mean": 0.1}]) == []


def test_three_evaluations_where_the_judge_rises_and_the_check_falls_are_warned_about(tmp_path, caplog):
    from agentrl.records.tracking import reward_hacking_trend

    evaluations = [(0, 0.30, 0.50), (2, 0.40, 0.45), (4, 0.50, 0.40), (6, 0.60, 0.30), (8, 0.55, 0.20)]
    with caplog.at_level("WARNING", logger="agentrl.records.tracking"):
        for step, judged, independent in evaluations:
            record_step(tmp_path, step, "val", [], {"reward_mean": judged, "independent_reward": independent})
    warned = [r.message.split(":")[0] for r in caplog.records if r.name == "agentrl.records.tracking"]
    assert warned == ["step 4", "step 6"]  # 0->2->4 and 2->4->6 both rose and fell; at 8 the judge fell too
    records = read_metrics(tmp_path)
    assert reward_hacking_trend(records[:2]) is False  # two evaluations are no trend
    assert reward_hacking_trend([{**r, "split": "train"} for r in records]) is False  # val is what it reads


FILE_SIZE_LIMIT = """
import math, os, resource, signal, sys
from pathlib import Path
from agentrl.records.tracking import append_metrics, read_metrics
run = Path(sys.argv[1])
append_metrics(run, {"step": 1, "split": "train", "reward_mean": 0.5})
size = (run / "metrics.jsonl").stat().st_size
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # over the limit a write fails (EFBIG) instead of killing us
resource.setrlimit(resource.RLIMIT_FSIZE, (size + 40, size + 40))  # room for part of the next line only
try:
    append_metrics(run, {"step": 2, "split": "train", "note": "x" * 200})
except OSError as error:
    print("refused:", error)
assert (run / "metrics.jsonl").stat().st_size == size, "a torn line was left behind"
print("records:", [r["step"] for r in read_metrics(run)])
"""


def test_a_full_disk_leaves_no_torn_metrics_line(tmp_path):
    """RLIMIT_FSIZE makes a write fail part-way, as a full disk does."""
    result = subprocess.run(
        [sys.executable, "-c", FILE_SIZE_LIMIT, str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "refused:" in result.stdout and "records: [1]" in result.stdout


def test_records_at_the_same_step_and_split_never_replace_each_other(tmp_path):
    from agentrl.records.run_folder import RunFolder

    groups = sample_groups() * 2
    record_step(tmp_path, 3, "train", groups, {"reward_mean": 0.5})  # the trained step 3
    record_step(tmp_path, 3, "train", groups[:1], {"reward_mean": 0.5, "skipped": True})  # skipped after it
    for _ in range(3):  # three held-out evaluations at step 0
        record_step(tmp_path, 0, "val", groups[1:], {"reward_mean": 1.0})
    folder = RunFolder(tmp_path)
    assert [p.name for p in folder.trajectory_files("train")] == ["train-0003.jsonl", "train-0003.2.jsonl"]
    assert len(load_trajectories(folder.trajectories("train", 3))) == 2
    assert len(load_trajectories(folder.trajectories("train", 3, copy=2))) == 1
    assert [p.name for p in folder.trajectory_files("val")] == [
        "val-0000.jsonl",
        "val-0000.2.jsonl",
        "val-0000.3.jsonl",
    ]
    assert sorted(p.name for p in folder.transcripts_dir.iterdir()) == [
        "train-0003.2.html", "train-0003.html", "val-0000.2.html", "val-0000.3.html", "val-0000.html"]  # fmt: skip
    assert "(record 3)" in folder.transcript("val", 0, copy=3).read_text()
    assert not list(tmp_path.rglob("*.tmp"))


def test_art_benchmarking_reads_every_copy_with_its_step(tmp_path):
    from agentrl.art.utils.benchmarking import load_trajectories as art_rows

    for _ in range(2):
        record_step(tmp_path / "proj" / "models" / "m", 12, "val", sample_groups(), {"reward_mean": 0.5})
    rows = art_rows("proj", art_path=str(tmp_path))
    assert {(r["split"], r["step"]) for r in rows} == {("val", 12)} and len(rows) == 2 * 2


def test_a_run_whose_steps_were_all_skipped_still_plots_their_rewards(tmp_path):
    skipped_run, fresh_run = tmp_path / "a" / "run", tmp_path / "b" / "run"  # one name: one title
    fresh_run.mkdir(parents=True)
    for step in range(3):
        record_step(skipped_run, 0, "train", sample_groups(), {"reward_mean": 0.25 * step, "skipped": True})
    plotted = plot_rewards(skipped_run).read_bytes()
    assert plotted[:8] == b"\x89PNG\r\n\x1a\n" and plotted != plot_rewards(fresh_run).read_bytes()


def test_records_are_never_replaced_on_a_file_system_without_hard_links(tmp_path, monkeypatch):
    import errno
    import os

    from agentrl.foundation.files import write_text_new

    def no_links(*args, **kwargs):
        raise OSError(errno.EPERM, "hard links are not supported here")

    monkeypatch.setattr(os, "link", no_links)
    names = lambda: (tmp_path / f"r{copy}.txt" for copy in range(1, 10))  # noqa: E731
    assert write_text_new(names(), "first") == tmp_path / "r1.txt"
    assert write_text_new(names(), "second") == tmp_path / "r2.txt"
    assert (tmp_path / "r1.txt").read_text() == "first" and not list(tmp_path.glob(".*.tmp"))


def test_tool_call_text_the_server_could_not_parse_is_counted_and_marked():
    from agentrl.records.step_metrics import step_line
    from tests.helpers import make_choice

    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    cut_off = make_choice([1, 2], content='<tool_call>\n{"name": "add", "argu')  # max_tokens ran out inside a call
    written = {"role": "assistant", "content": "<tool_call>oops</tool_call> and <tool_call>again"}
    answered = make_choice([3], content="The sum is 5.")
    with_tools = Trajectory(
        messages_and_choices=[{"role": "user", "content": "2 + 3?"}, cut_off, written, answered], tools=tools
    )
    assert step_line({"loss": 0.1}, [TrajectoryGroup([with_tools])], skipped=False)["tool_call_parse_failures"] == 3
    page = transcript_html([TrajectoryGroup([with_tools])], "t")
    assert "tool_call_parse_failures: 3" in page and page.count("tool call(s) the server could not parse") == 2
    # No tools offered: no such metric (a model that writes the tag unprompted has no call to fail).
    without_tools = with_tools.model_copy(update={"tools": None})
    assert "tool_call_parse_failures" not in step_line({}, [TrajectoryGroup([without_tools])], skipped=None)
    assert "could not parse" not in transcript_html([TrajectoryGroup([without_tools])], "t")
