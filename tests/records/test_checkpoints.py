"""Checkpoint folders: atomic saves, crash leftovers ignored and swept, never overwritten, pruning."""

import asyncio
import functools
from pathlib import Path
from typing import Any

import pytest

import agentrl
from agentrl import CheckpointError
from agentrl.records.checkpoints import CheckpointStore


def writer(payload: str):
    def write(folder: Path) -> None:
        (folder / "adapter_model.safetensors").write_text(payload)

    return write


def test_saves_are_numbered_complete_and_never_overwritten(tmp_path):
    store = CheckpointStore(tmp_path)
    assert store.latest_step() is None
    store.save(0, writer("zero"), {"metrics": {}})
    store.save(1, writer("one"), {"metrics": {"reward_mean": 0.4}})
    assert store.steps() == [0, 1] and store.latest_step() == 1
    assert store.path(1).name == "0001" and (store.path(1) / "adapter_model.safetensors").read_text() == "one"
    assert store.info(1) == {"step": 1, "metrics": {"reward_mean": 0.4}}
    with pytest.raises(CheckpointError, match="never overwritten"):
        store.save(1, writer("other"), {})
    assert (store.path(1) / "adapter_model.safetensors").read_text() == "one"


def test_a_crash_during_a_save_leaves_no_checkpoint_behind(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(0, writer("zero"), {})

    def crashing(folder: Path) -> None:
        (folder / "adapter_model.safetensors").write_text("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        store.save(1, crashing, {})
    assert store.steps() == [0] and not store.path(1).exists()
    # A leftover from a hard kill (no cleanup ran) is ignored and swept.
    (store.root / ".staging-0001-deadbeef").mkdir()
    (store.root / "0002").mkdir()  # a folder without its info file is not a checkpoint
    assert store.latest_step() == 0
    store.sweep_staging()
    assert not (store.root / ".staging-0001-deadbeef").exists()


def test_delete_keeps_the_last_and_the_protected(tmp_path):
    store = CheckpointStore(tmp_path)
    for step in range(5):
        store.save(step, writer(str(step)), {"metrics": {}})
    assert store.delete(keep_last=2, keep={1}) == [0, 2]
    assert store.steps() == [1, 3, 4]
    assert store.delete(keep_last=1) == [1, 3]
    with pytest.raises(ValueError, match="keep_last"):
        store.delete(keep_last=0)


def test_every_file_and_the_folder_reach_the_disk_before_the_rename(tmp_path, monkeypatch):
    import os

    synced, renamed_at = [], []
    real_fsync, real_rename = os.fsync, os.rename

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    def rename(src, dst) -> None:
        renamed_at.append(len(synced))
        real_rename(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)

    def write(folder: Path) -> None:
        (folder / "adapter_model.safetensors").write_text("weights")
        (folder / "optimizer.pt").write_text("moments")

    store = CheckpointStore(tmp_path)
    store.save(1, write, {"metrics": {}})
    before_rename = {Path(p).name for p in synced[: renamed_at[0]]}
    assert {"adapter_model.safetensors", "optimizer.pt", "agentrl-checkpoint.json"} <= before_rename
    assert any(name.startswith(".staging-0001") for name in before_rename)  # the folder's entries
    assert Path(synced[-1]) == store.root  # and the parent, after the rename


def test_corrupt_checkpoints_are_moved_aside_and_resume_takes_the_newest_valid(base_model_path, tmp_path, caplog):
    from agentrl.backend.run_lock import RunLock
    from agentrl.backend.session import ModelSession, TrainerThread
    from agentrl.backend.training.trainer import Trainer
    from agentrl.records.checkpoints import OPTIMIZER_FILE

    model = agentrl.TrainableModel(name="m", project="p", base_path=str(tmp_path))
    trainer = Trainer(base_model_path)
    trainer.add_adapter("default", agentrl.LoRAConfig())
    store = CheckpointStore(model.run_dir)
    no_server: Any = None  # resuming reads checkpoints into the trainer; nothing is served yet
    session = ModelSession(model, "default", store, RunLock(model.run_dir), trainer, no_server, TrainerThread())
    for step in range(5):
        store.save(step, functools.partial(trainer.save, "default"), {"metrics": {}})
    (store.path(4) / "adapter_model.safetensors").write_bytes(b"torn")  # a torn adapter
    (store.path(3) / OPTIMIZER_FILE).unlink()  # a lost optimizer file: never a silent reset
    (store.path(2) / "agentrl-checkpoint.json").write_text("")  # an empty info file
    assert session.resume() == 1
    assert store.steps() == [0, 1]
    moved = sorted(p.name[:13] for p in store.root.glob(".corrupt-*"))
    assert moved == [".corrupt-0002", ".corrupt-0003", ".corrupt-0004"]  # kept for inspection
    assert "cannot read the adapter" in caplog.text and "cannot read the optimizer state" in caplog.text
    trainer.add_adapter("rank4", agentrl.LoRAConfig(rank=4))
    with pytest.raises(agentrl.CheckpointError, match="does not fit this model's LoRA"):
        trainer.load("rank4", store.path(1))


def test_delete_checkpoints_keeps_the_best_held_out_checkpoint_by_default(tmp_path):
    from agentrl.backend.local import LocalBackend
    from agentrl.backend.run_lock import RunLock
    from agentrl.backend.session import ModelSession, TrainerThread
    from agentrl.records.tracking import record_step

    model = agentrl.TrainableModel(name="m", project="p", base_path=str(tmp_path))
    backend = LocalBackend()
    store = CheckpointStore(model.run_dir)
    for step in range(5):
        store.save(step, lambda folder: None, {"metrics": {}})
        record_step(model.run_dir, step, "val", [], {"reward_mean": [0.1, 0.2, 0.9, 0.3, 0.4][step]})
    unused: Any = None  # deleting checkpoints needs neither the trainer nor the server
    session = ModelSession(model, "default", store, RunLock(model.run_dir), unused, unused, TrainerThread(), step=4)
    backend.sessions[str(model.run_dir.resolve())] = session
    model._backend = backend
    assert asyncio.run(model.delete_checkpoints()) == [0, 1, 3]  # ART's default: keep the best val and the latest
    assert store.steps() == [2, 4]
    with pytest.raises(agentrl.ConfigurationError, match="no checkpoint has a recorded 'val/nope'"):
        asyncio.run(model.delete_checkpoints(best_by="val/nope"))


def test_a_steps_result_carries_every_metric_its_metrics_line_records(tmp_path):
    from agentrl.backend.run_lock import RunLock
    from agentrl.backend.session import ModelSession, TrainerThread
    from agentrl.backend.training.adapter_trainer import StepOutcome
    from agentrl.records.tracking import read_metrics

    model = agentrl.TrainableModel(name="m", project="p", base_path=str(tmp_path))
    unused: Any = None  # a skipped step touches neither the trainer nor the server
    session = ModelSession(model, "default", CheckpointStore(model.run_dir), RunLock(model.run_dir), unused, unused,
                           TrainerThread())  # fmt: skip
    group = agentrl.TrajectoryGroup(
        [agentrl.Trajectory(reward=0.5, metrics={"tool_calls": 2.0, "judge_flip_rate": 0.25})] * 2
    )
    result = asyncio.run(session.commit(StepOutcome(False, {"frac_zero_variance_groups": 1.0}), split="train",
                                        groups=[group]))  # fmt: skip
    (line,) = read_metrics(model.run_dir)
    recorded = {k: v for k, v in line.items() if k not in ("time", "step", "split", "skipped")}
    assert result.metrics == recorded
    assert (result.metrics["tool_calls"], result.metrics["judge_flip_rate"], result.metrics["reward"]) == (
        2.0,
        0.25,
        0.5,
    )


def test_a_step_as_the_kl_reference_resolves_to_its_checkpoint_folder(tmp_path):
    """`TrainConfig.kl_reference` as a step (ART's `kl_penalty_reference_step`, and its PipelineTrainer lag as a
    negative step) names that checkpoint's folder; a step the run does not keep raises, naming the kept ones."""
    from agentrl.backend.run_lock import RunLock
    from agentrl.backend.session import ModelSession, TrainerThread

    model = agentrl.TrainableModel(name="m", project="p", base_path=str(tmp_path))
    store = CheckpointStore(model.run_dir)
    for step in (0, 1, 2, 3):
        store.save(step, writer(str(step)), {"metrics": {}})
    unused: Any = None  # resolving reads the checkpoint folders only
    session = ModelSession(model, "default", store, RunLock(model.run_dir), unused, unused, TrainerThread(), step=3)
    config = agentrl.TrainConfig(kl_advantage_coef=0.1)
    for reference, step in ((2, 2), (-1, 3), (-3, 1), (-9, 0)):  # -1: the checkpoint this step trains from
        resolved = session.with_kl_reference(config.model_copy(update={"kl_reference": reference}))
        assert resolved.kl_reference == str(store.path(step))
    assert session.with_kl_reference(config) is config  # the base model: nothing to resolve
    with pytest.raises(agentrl.ConfigurationError, match=r"checkpoint 7.*\[0, 1, 2, 3\]"):
        session.with_kl_reference(config.model_copy(update={"kl_reference": 7}))
