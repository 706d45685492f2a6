"""W&B metrics and Weave traces for users who turn them on; nothing of either for those who do not."""

import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import agentrl
from agentrl.records.checkpoints import CheckpointStore
from agentrl.records.wandb_metrics import (
    RUN_ID_FILE,
    WANDB_SERVICE_ENV,
    WandbMetrics,
    leave_a_parents_wandb_service,
    wandb_requested,
)
from tests.fake_weave import FakeWeave
from tests.helpers import wandb_history

ROOT = Path(__file__).resolve().parents[2]


def test_wandb_is_on_when_asked_or_when_a_key_is_set(monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    assert not wandb_requested(None) and wandb_requested(True)
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    assert wandb_requested(None) and not wandb_requested(False)


def test_with_neither_configured_wandb_and_weave_are_never_imported(tmp_path):
    code = """
import asyncio, sys
import agentrl
from agentrl.records.tracking import record_step
from agentrl_environments.email_agent.env import rollout
from tests.helpers import sample_groups

@agentrl.traced
async def traced_rollout(x):
    return x

assert asyncio.run(traced_rollout(3)) == 3
record_step(__import__("pathlib").Path(sys.argv[1]), 1, "train", sample_groups(), {"reward_mean": 0.5})
print(sorted(m for m in sys.modules if m.split(".")[0] in ("wandb", "weave")))
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "WF_"))}
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_a_wandb_service_inherited_from_another_process_is_left_and_our_own_is_kept(monkeypatch):
    """A killed run's W&B run would stay "in use" in a parent's service and refuse the resume (test_resume)."""
    parents = f"3-{os.getppid()}-unix-/tmp/wandb-service.sock"
    monkeypatch.setenv(WANDB_SERVICE_ENV, parents)
    leave_a_parents_wandb_service()
    assert WANDB_SERVICE_ENV not in os.environ
    ours = f"3-{os.getpid()}-tcp-localhost-40123"
    monkeypatch.setenv(WANDB_SERVICE_ENV, ours)
    leave_a_parents_wandb_service()
    assert os.environ[WANDB_SERVICE_ENV] == ours


def test_wandb_gets_every_step_by_training_step_and_a_resumed_run_appends(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    first = WandbMetrics(tmp_path, project="tests", name="agent", config={"base_model": "smollm2-135m-instruct"})
    first.log(0, "val", {"reward_mean": 0.25, "num_trajectories": 4})
    first.log(1, "train", {"reward_mean": 0.5, "skipped": False, "kl_sampler_trainer": math.nan})
    first.finish()
    run_id = (tmp_path / RUN_ID_FILE).read_text()
    again = WandbMetrics(tmp_path, project="tests", name="agent", config={})
    again.log(1, "val", {"reward_mean": 0.75})
    again.finish()

    runs = wandb_history(tmp_path)
    assert list(runs) == [run_id], "the resumed process must append to the same W&B run"
    rows = runs[run_id]
    assert {"training_step": 0, "val/reward_mean": 0.25, "val/num_trajectories": 4.0} in [
        {k: v for k, v in r.items() if not k.startswith("_")} for r in rows
    ]
    train = next(r for r in rows if "train/reward_mean" in r)
    assert train["training_step"] == 1 and train["train/skipped"] == 0.0
    assert "train/kl_sampler_trainer" not in train  # NaN is left out, not sent
    assert any(r.get("val/reward_mean") == 0.75 and r["training_step"] == 1 for r in rows)


def test_rollouts_are_traced_as_weave_ops_with_their_completions(served_model, tmp_path):
    """A real rollout on the project's server, traced into a local server speaking Weave's protocol."""
    fake = FakeWeave()
    code = """
import asyncio, os, sys
import agentrl
from agentrl_environments.larger_number.task import rollout, scenarios

policy = agentrl.Model(name=sys.argv[2], base_url=sys.argv[1], api_key=os.environ["AGENTRL_TEST_SERVER_KEY"])
agentrl.enable_weave("me/agentrl-test")
trajectory = asyncio.run(rollout(policy, scenarios("test", 1, seed=3)[0]))
agentrl.disable_weave()
print("REWARD", trajectory.reward)
"""
    try:
        env = {
            **os.environ,
            **fake.environment(),
            "AGENTRL_TEST_SERVER_KEY": served_model.backend.gateway.token,
        }
        args = [served_model.backend.base_url, served_model.inference_name]
        result = subprocess.run(
            [sys.executable, "-c", code, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
        )
        assert result.returncode == 0, result.stderr[-3000:]
        reward = float(result.stdout.split("REWARD")[-1])
        rollouts = [c for c in fake.calls if "/op/rollout:" in c["op_name"]]
        assert len(rollouts) == 1, [c["op_name"] for c in fake.calls]
        traced = rollouts[0]
        assert traced["inputs"]["model"] == served_model.inference_name  # the model by its served name
        assert traced["output"]["reward"] == reward and traced["exception"] is None
        completions = [c for c in fake.calls if "openai.chat.completions.create" in c["op_name"]]
        assert completions and all(c["parent_id"] == traced["id"] for c in completions)
    finally:
        fake.close()


def test_traced_refuses_a_plain_function():
    import pytest

    with pytest.raises(TypeError, match="async rollout functions"):
        agentrl.traced(lambda x: x)


def test_arts_update_wandb_config_before_and_after_the_run_opens(tmp_path, monkeypatch):
    """ART's `model.update_wandb_config`: kept until the run opens (at register), merged into it once open."""
    import agentrl.art as art
    from agentrl.backend.run_lock import RunLock
    from agentrl.backend.session import ModelSession, TrainerThread

    monkeypatch.setenv("WANDB_MODE", "offline")
    model = art.TrainableModel(name="agent", project="tests", base_path=str(tmp_path))
    model.update_wandb_config({"dataset": {"name": "tic-tac-toe", "size": 96}})  # before the run exists
    metrics = WandbMetrics(model.run_dir, project="tests", name="agent", config={"base_model": "x"})
    backend = agentrl.LocalBackend()
    unused: Any = None  # the trainer and server play no part here
    session = ModelSession(model, "default", CheckpointStore(model.run_dir), RunLock(model.run_dir), unused, unused,
                           TrainerThread(), wandb=metrics)  # fmt: skip
    backend.sessions[str(model.run_dir.resolve())] = session
    model._backend = backend  # registered (as `register` leaves it)
    model._sync_wandb_config()  # what register does once the run is open
    model.update_wandb_config({"dataset": {"size": 128}})  # merged key by key into the open run
    assert dict(metrics.run.config)["dataset"] == {"name": "tic-tac-toe", "size": 128}
    assert dict(metrics.run.config)["base_model"] == "x"
    metrics.finish()
