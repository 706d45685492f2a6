"""The run's metrics in Weights & Biases, for users who have it: one W&B run per agentrl run folder.

Off unless asked for: a model's `wandb=True`, or `wandb=None` (the default) with `WANDB_API_KEY`
set. Off means `wandb` is never imported and nothing touches the network. The W&B run id is kept in
the run folder, so a resumed run (after a crash, or a later `agentrl train`) appends to the same W&B
run. Every metric is logged against `training_step`, so evaluations logged at the step they were
taken (before and after training) line up with the training curves. `WANDB_MODE=offline` works.

A run's W&B run lives and dies with its process: a process started by one that had set up W&B (a
notebook running `agentrl train`, a test) starts its own W&B service rather than join the parent's,
whose service would keep a killed run's id "in use" and refuse the run's resume.
"""

from __future__ import annotations

import math
import os
import secrets
from pathlib import Path
from typing import Any

from agentrl.foundation.distribution import install_extra
from agentrl.foundation.errors import AgentRLError
from agentrl.foundation.files import write_text_atomic

RUN_ID_FILE = "wandb_run_id"
WANDB_SERVICE_ENV = "WANDB_SERVICE"  # where wandb.setup() leaves its service's token for child processes


def wandb_requested(setting: bool | None) -> bool:
    """An explicit setting wins; otherwise W&B is on exactly when `WANDB_API_KEY` is set."""
    return setting if setting is not None else bool(os.environ.get("WANDB_API_KEY"))


def wandb_service_owner() -> int | None:
    """The pid of the process that started the W&B service named in `WANDB_SERVICE` ("3-<pid>-..."); None if unset."""
    parts = os.environ.get(WANDB_SERVICE_ENV, "").split("-")
    return int(parts[1]) if len(parts) >= 3 and parts[1].isdigit() else None


def leave_a_parents_wandb_service() -> None:
    """Forget a W&B service token inherited from another process, so that W&B starts a service owned by
    this process; a token this process wrote is kept."""
    if os.environ.get(WANDB_SERVICE_ENV) and wandb_service_owner() != os.getpid():
        del os.environ[WANDB_SERVICE_ENV]


class WandbMetrics:
    """An open W&B run that receives each recorded step's metrics as `{split}/{name}`."""

    def __init__(self, run_dir: Path, *, project: str, name: str, config: dict[str, Any]) -> None:
        try:
            import wandb
        except ImportError as error:
            raise AgentRLError(
                "W&B reporting is on (wandb=True, or WANDB_API_KEY is set) but wandb is not installed: "
                f"{install_extra('wandb')}, or pass wandb=False to the model"
            ) from error
        leave_a_parents_wandb_service()
        id_file = run_dir / RUN_ID_FILE
        if id_file.exists():
            run_id = id_file.read_text().strip()
        else:
            run_id = f"{name}-{secrets.token_hex(4)}"
            run_dir.mkdir(parents=True, exist_ok=True)
            write_text_atomic(id_file, run_id)
        try:
            self.run = wandb.init(
                project=project,
                name=name,
                id=run_id,
                resume="allow",
                dir=str(run_dir),
                config=config,
                reinit="create_new",
                settings=wandb.Settings(console="off", silent=True),
            )
        except Exception as error:
            raise AgentRLError(
                f"could not start the W&B run {project}/{run_id}: {error}. Without a network use "
                "WANDB_MODE=offline (and `wandb sync` later); without W&B pass wandb=False to the model"
            ) from error
        self.run.define_metric("training_step")
        self.run.define_metric("*", step_metric="training_step")

    def log(self, step: int, split: str, metrics: dict[str, Any]) -> None:
        values = {
            f"{split}/{key}": float(value)
            for key, value in metrics.items()
            if isinstance(value, int | float) and math.isfinite(value)
        }
        self.run.log({"training_step": step, **values})

    def update_config(self, config: dict[str, Any]) -> None:
        """Merge `config` into the run's W&B config (`allow_val_change`: a later call may change a key)."""
        self.run.config.update(config, allow_val_change=True)  # type: ignore[no-untyped-call]  # wandb ships no types for it

    def finish(self) -> None:
        self.run.finish()
