"""A trained step's input, kept in its checkpoint, so the step can be trained again (`replay`).

The groups the trainer was given (their exact sampled tokens, logprobs and rewards) and the
`TrainConfig`, or a supervised call's demonstrations and `SFTConfig`; and the conditions a bit-exact
repeat needs (micro-batch size, threads, number format, device, torch, ranks, sharding):
gzip-compressed JSON lines, written into the checkpoint's staging folder, so the input exists
exactly when its checkpoint does and goes when retention deletes it.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.data.trajectory import History
from agentrl.data.trajectory_group import TrajectoryGroup
from agentrl.foundation.config import SFTConfig, TrainConfig
from agentrl.foundation.errors import CheckpointError
from agentrl.foundation.files import gunzip_bounded
from agentrl.records.checkpoints import MAX_RECORD_BYTES, STEP_INPUT_FILE
from agentrl.records.tracking import groups_from_rows, trajectory_lines


@dataclass(frozen=True)
class StepInput:
    """What one step trained on, and under which conditions: a GRPO step's groups under a `TrainConfig`,
    or (`supervised`) one `train_sft` call's demonstrations under an `SFTConfig`."""

    groups: list[TrajectoryGroup]
    config: TrainConfig | SFTConfig
    conditions: TrainingConditions
    demonstrations: list[History] = field(default_factory=list)

    @property
    def supervised(self) -> bool:
        return isinstance(self.config, SFTConfig)


@dataclass(frozen=True)
class TrainingConditions:
    """What must be the same for a step to give the same bytes again: the micro-batch plan (the order
    gradients are summed in), CPU threads (how each matmul splits its sums; rank 0's), deterministic
    kernels (on a GPU), the number format, the device, torch's version, the number of ranks (how the
    sequences are dealt and their gradients summed) and whether they shard the layers. A `train_sft` call
    also keeps every batch's micro-batch size, in order (a GPU out of memory halves it from one batch on).
    Fields a checkpoint from an older agentrl did not record are None."""

    micro_batch_tokens: int
    threads: int | None = None
    deterministic: bool = False
    bf16: bool | None = None
    device: str | None = None
    torch: str | None = None
    ranks: int = 1
    sharded: bool = False
    batch_micro_batch_tokens: tuple[int, ...] | None = None

    @classmethod
    def here(cls, micro_batch_tokens: int, *, bf16: bool, device: str, ranks: int, sharded: bool) -> TrainingConditions:
        """This process's conditions for a step planned at `micro_batch_tokens`."""
        import torch

        return cls(
            micro_batch_tokens,
            threads=torch.get_num_threads(),
            deterministic=torch.are_deterministic_algorithms_enabled(),
            bf16=bf16,
            device=device,
            torch=torch.__version__,
            ranks=ranks,
            sharded=sharded,
        )

    def as_record(self) -> dict[str, Any]:
        """As the step input's JSON keeps them (what was not recorded is left out)."""
        record = {k: v for k, v in dataclasses.asdict(self).items() if v is not None}
        if self.batch_micro_batch_tokens is not None:
            record["batch_micro_batch_tokens"] = list(self.batch_micro_batch_tokens)
        return record

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> TrainingConditions:
        """Read back `as_record`'s JSON, or an older checkpoint's (fields it lacks take their defaults)."""
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in record.items() if k in known}
        if values.get("batch_micro_batch_tokens") is not None:
            values["batch_micro_batch_tokens"] = tuple(int(n) for n in values["batch_micro_batch_tokens"])
        return cls(**values)


def use_deterministic_kernels(on: bool = True) -> None:
    """Kernels that give the same bytes for the same input, or (`on=False`) torch's faster defaults. On a
    GPU the defaults are not: attention's backward and split-K matmuls add in an order that varies from
    run to run (a replayed step differed by up to 7e-5 on an H100). cuBLAS also needs a fixed workspace,
    set here unless already set; it must come before the process's first matmul on the GPU."""
    import torch

    if on:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(on)


def write_step_input(folder: Path, step_input: StepInput) -> int:
    """Write `STEP_INPUT_FILE` into `folder` (a checkpoint being staged); returns its size in bytes."""
    head = {
        "config": step_input.config.model_dump(mode="json"),
        "conditions": step_input.conditions.as_record(),
        "supervised": step_input.supervised,
    }
    # A demonstration may be a Trajectory: what SFT trains on is its History (messages and tools).
    rows = [json.dumps(h.model_dump(mode="json", include=set(History.model_fields))) for h in step_input.demonstrations]
    lines = [json.dumps(head), *(rows if step_input.supervised else trajectory_lines(step_input.groups))]
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as compressed:  # mtime 0: the same input, the same bytes
        compressed.write(("\n".join(lines) + "\n").encode())
    (folder / STEP_INPUT_FILE).write_bytes(buffer.getvalue())
    return len(buffer.getvalue())


def read_step_input(folder: Path) -> StepInput:
    """The input recorded with a checkpoint; `CheckpointError` naming the file if it is missing or unreadable."""
    path = folder / STEP_INPUT_FILE
    if not path.exists():
        raise CheckpointError(
            f"{path} does not exist: this step's input was not recorded (the first checkpoint, or a run "
            "from before agentrl recorded step inputs)"
        )
    try:
        text = gunzip_bounded(path.read_bytes(), MAX_RECORD_BYTES, str(path)).decode()
        head, *rows = [json.loads(line) for line in text.splitlines()]
        if head.get("supervised", False):
            demonstrations = [History.model_validate(row) for row in rows]
            return StepInput(
                [],
                SFTConfig.model_validate(head["config"]),
                TrainingConditions.from_record(head["conditions"]),
                demonstrations,
            )
        return StepInput(
            groups_from_rows(rows),
            TrainConfig.model_validate(head["config"]),
            TrainingConditions.from_record(head["conditions"]),
        )
    except Exception as error:  # noqa: BLE001 - gzip, JSON and validation errors alike: the file is damaged
        raise CheckpointError(f"cannot read the step input {path}: {type(error).__name__}: {error}") from error
