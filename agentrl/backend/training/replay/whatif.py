"""Train recorded steps again under another `TrainConfig`: `agentrl whatif RUN --from K --steps N --loss gspo`.

The rollouts (and the rewards a judge gave them) are the recorded step inputs, so nothing is sampled or
judged again: only the update changes. The new steps go into a new run folder (checkpoints, step
inputs, metrics.jsonl) beside the original, and each is compared with the original step: loss, KL
between sampler and trainer, gradient norm, and the size of the update (the norm of the change in the
adapter's weights). With no change to the config, the steps come out identical to the original ones.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError

from agentrl.backend.training.replay.replay import (
    REPLAY_ADAPTER,
    checked_steps,
    checkpoint_state,
    recorded_conditions,
    state_sha256,
    train_recorded,
    trainer_at,
    trainer_state,
)
from agentrl.backend.training.step_input import StepInput, write_step_input
from agentrl.foundation.config import SFTConfig, TrainConfig
from agentrl.foundation.errors import CheckpointError, ConfigurationError
from agentrl.records.checkpoints import INFO_FILE, CheckpointStore
from agentrl.records.runs import COMPARED
from agentrl.records.tracking import append_metrics

"""The metrics each what-if step is compared on, beside the original step's."""


@dataclass(frozen=True)
class WhatIfStep:
    """One step trained again under the changed config, against the original step."""

    step: int
    original: dict[str, float]
    changed: dict[str, float]
    identical: bool
    """Adapter and optimizer state byte for byte the original checkpoint's."""


def changed_config(step: int, config: TrainConfig | SFTConfig, changes: dict[str, Any]) -> TrainConfig:
    """Step `step`'s `config` with `changes` applied and validated; `ConfigurationError` naming the bad
    setting, or the supervised step in the range (what-if changes a `TrainConfig`)."""
    if isinstance(config, SFTConfig):
        raise ConfigurationError(
            f"step {step} is a supervised step (train_sft), which a TrainConfig change does not apply to: "
            "choose a range of RL steps with --from and --steps (`agentrl replay` trains a supervised step again)"
        )
    try:
        return TrainConfig.model_validate({**config.model_dump(), **changes})
    except ValidationError as error:
        raise ConfigurationError(f"the what-if changes {changes} are not a valid TrainConfig: {error}") from error


def update_norm(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> float:
    """The norm of the change in the adapter's weights (not its optimizer state) over a step."""
    weights = [name for name in after if name.startswith("weight ")]
    return float(torch.stack([(after[n].double() - before[n].double()).norm() for n in weights]).norm())


def what_if(
    run_dir: Path, *, first: int, steps: int, changes: dict[str, Any], out_dir: Path, device: str | None = None
) -> list[WhatIfStep]:
    """Train steps `first`..`first + steps - 1` of the run in `run_dir` again from checkpoint `first - 1`,
    each on its recorded input under its recorded config with `changes`, into a new run at `out_dir`."""
    if steps < 1:
        raise ConfigurationError(f"--steps must be at least 1, not {steps}")
    store, last = CheckpointStore(run_dir), first + steps - 1
    inputs = checked_steps(store, first, last)
    configs = [changed_config(step, step_input.config, changes) for step, step_input in enumerate(inputs, first)]
    out = CheckpointStore(out_dir)
    if out.steps() or (out_dir / "metrics.jsonl").exists():
        raise CheckpointError(f"{out_dir} already holds a run; runs are never overwritten: name another")
    results = []
    with (
        recorded_conditions(inputs[0].conditions),
        contextlib.closing(trainer_at(store, first - 1, inputs[0].conditions, device=device)) as trainer,
    ):
        origin = {"whatif_of": str(run_dir), "changes": changes}
        out.save(first - 1, lambda folder: _copy_checkpoint(store.path(first - 1), folder), {"metrics": {}, **origin})
        before, recorded = trainer_state(trainer), checkpoint_state(store.path(first - 1))
        for step, step_input, config in zip(range(first, last + 1), inputs, configs, strict=True):
            outcome, conditions = train_recorded(trainer, step_input, config)
            after = trainer_state(trainer)
            changed = {**outcome.metrics, "update_norm": update_norm(before, after)}
            trained_on = StepInput(step_input.groups, config, conditions)
            out.save(step, functools.partial(_write_step, trainer, trained_on), {"metrics": changed, **origin})
            append_metrics(out_dir, {"step": step, "split": "train", **changed})
            recorded_before, recorded = recorded, checkpoint_state(store.path(step))  # each checkpoint read once
            original = {**store.info(step).get("metrics", {}), "update_norm": update_norm(recorded_before, recorded)}
            results.append(
                WhatIfStep(
                    step,
                    {k: original[k] for k in COMPARED if k in original},
                    {k: changed[k] for k in COMPARED if k in changed},
                    state_sha256(after) == state_sha256(recorded),
                )
            )
            before = after
    return results


def _copy_checkpoint(source: Path, folder: Path) -> None:
    for path in source.iterdir():
        if path.is_file() and path.name != INFO_FILE:  # the store writes its own
            shutil.copy2(path, folder / path.name)


def _write_step(trainer: Any, trained_on: StepInput, folder: Path) -> None:
    trainer.save(REPLAY_ADAPTER, folder)
    write_step_input(folder, trained_on)
