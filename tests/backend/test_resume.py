"""Resume: kill a training process (SIGKILL) after a checkpoint; a new one resumes at that step with the same weights.

Both runs train with two trainer ranks (torch.distributed), the killed one sharded (FSDP2), the new
one replicated: the killed run's ranks and server go with it, and every rank of the new run holds
the checkpoint's weights (checkpoints are whole tensors, whatever wrote them). Loading with one
rank is covered by the checkpoint tests in test_bad_input.py.
"""

import asyncio
import gc
import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
import wandb
from safetensors.torch import load_file

import agentrl
from agentrl.client.dataset import content_ids
from agentrl.records.wandb_metrics import RUN_ID_FILE, wandb_service_owner
from agentrl_environments.larger_number.task import rollout, scenarios
from tests.helpers import group_processes, wandb_history

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
async def test_a_killed_run_resumes_at_its_last_checkpoint(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    # This process has set up W&B before it starts the run, as a notebook might: the child inherits its
    # service's token, and must not leave its killed W&B run "in use" in this process's service. (Not torn
    # down after: the resumed run below uses that service, as it did before this setup was added.)
    wandb.setup()
    assert wandb_service_owner() == os.getpid()
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.resume_child", str(tmp_path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    report = None
    deadline = time.monotonic() + 600
    lines = []
    while time.monotonic() < deadline:
        line = await asyncio.to_thread(child.stdout.readline)
        lines.append(line)
        if line.startswith("CHECKPOINTED") or not line:
            report = line.split() if line else None
            break
    try:
        assert report, "the child never checkpointed:\n" + "".join(lines[-40:])
        _, step, digest, server_pgid, rank_pids = report
        # While the child runs, its run folder is locked: a second process (this one) is refused.
        with pytest.raises(agentrl.RunLockedError, match=f"in use by process {child.pid}"):
            await agentrl.TrainableModel(name="resumable", project="tests", base_path=str(tmp_path)).register(
                agentrl.LocalBackend()
            )
    finally:
        child.send_signal(signal.SIGKILL)  # no cleanup code runs in the child; its lock goes with it
        child.wait(timeout=30)

    # Its vLLM server and trainer ranks are told of its death and go too: no orphans.
    ranks = [int(pid) for pid in rank_pids.split(",")]
    assert len(ranks) == 2

    def alive(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def leftovers() -> list:
        return group_processes(int(server_pgid)) + [pid for pid in ranks if alive(pid)]

    deadline = time.monotonic() + 60
    while leftovers() and time.monotonic() < deadline:
        await asyncio.sleep(1)
    assert leftovers() == []

    model = agentrl.TrainableModel(name="resumable", project="tests", base_path=str(tmp_path), wandb=True)
    backend = agentrl.LocalBackend(trainer_ranks=2)
    try:
        await model.register(backend)
        assert await model.get_step() == int(step) == 1
        assert model.inference_name == "resumable@1"
        checkpoint = model.run_dir / "checkpoints" / "0001" / "adapter_model.safetensors"
        assert hashlib.sha256(checkpoint.read_bytes()).hexdigest() == digest
        saved = load_file(checkpoint)
        for rank in (0, 1):
            live = backend.trainer.adapter_weights(backend.session(model).adapter, rank)
            assert saved.keys() == live.keys()
            for key in saved:
                torch.testing.assert_close(live[key].float(), saved[key].float(), rtol=0, atol=0)
        completion = await model.openai_client().chat.completions.create(
            model=model.inference_name, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert completion.choices[0].message.content is not None
        await model.log([agentrl.Trajectory(messages_and_choices=[{"role": "user", "content": "hi"}], reward=0.5)])

        # Exactly once: step 1 trained 4 scenarios (of batch 0, or some of batch 1 that finished first); the
        # killed step's in-flight groups are not in the record, and the resumed run samples them again.
        train = scenarios("train", 8, seed=5)
        everything = {f"0:{i}" for i in content_ids(train)}
        before_kill = model.trained_scenarios()
        assert len(before_kill) == 4 and all(steps == [1] for steps in before_kill.values())
        left = list(agentrl.iterate_dataset(train, batch_size=4, already_trained=before_kill, show_progress=False))
        assert {k for b in left for k in b.keys} == everything - set(before_kill)
        groups = [
            g for b in left for g in b.groups(lambda s: agentrl.TrajectoryGroup(rollout(model, s) for _ in range(4)))
        ]
        resumed = await model.train(await agentrl.gather_trajectory_groups(groups, show_progress=False))
        trained = model.trained_scenarios()
        assert set(trained) == everything and all(len(steps) == 1 for steps in trained.values())
        assert all(trained[k] == [resumed.step] for k in everything - set(before_kill))
        assert gc.get_freeze_count() > 0  # the engine took its imports' objects out of collection (freeze_heap)
    finally:
        await backend.close()
    assert gc.get_freeze_count() == 0  # and its stop put them back: a closed backend's trainer can be collected
    assert os.path.isdir(model.run_dir / "checkpoints" / "0000")
    steps = [m for m in agentrl.records.tracking.read_metrics(model.run_dir) if m["split"] == "train"]
    assert steps[0]["step"] == 1 and steps[0]["staleness_max"] == 0  # the in-flight groups died with the child

    # W&B: the resumed process appended to the killed one's W&B run, at the step it resumed from.
    assert len(list(model.run_dir.glob("wandb/offline-run-*"))) == 2  # the killed process's and ours
    runs = wandb_history(model.run_dir, killed=1)  # the killed process never wrote its exit record
    assert list(runs) == [(model.run_dir / RUN_ID_FILE).read_text()]
    assert {"training_step": 1, "val/reward_mean": 0.5} in [
        {k: r[k] for k in ("training_step", "val/reward_mean") if k in r} for r in runs[next(iter(runs))]
    ]
