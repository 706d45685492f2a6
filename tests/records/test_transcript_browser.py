"""The transcript page, rendered for real in headless Chromium: the trajectories and rewards are on screen."""

import shutil
import subprocess

import pytest

from agentrl.records.tracking import record_step
from tests.helpers import sample_groups

CHROMIUM = shutil.which("chromium")


@pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed (scripts/setup.sh --dev installs it as root)"
)
def test_transcript_page_shows_trajectories_and_rewards_in_a_browser(tmp_path):
    record_step(tmp_path, 3, "train", sample_groups(), {"reward_mean": 0.5})
    page = tmp_path / "transcripts" / "train-0003.html"
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
    ]
    dom = subprocess.run([CHROMIUM, *flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert "trajectory 0: reward 1.000" in dom.stdout and "trajectory 1: reward 0.000" in dom.stdout
    assert "search_emails" in dom.stdout and "$525" in dom.stdout
    screenshot = tmp_path / "transcript.png"  # kept in the test's temp dir as evidence
    subprocess.run(
        [CHROMIUM, *flags, f"--screenshot={screenshot}", "--window-size=1000,900", page.as_uri()],
        capture_output=True,
        timeout=120,
    )
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and screenshot.stat().st_size > 10_000
