"""What a backend gives back and may report without knowing any model: `TrainResult` (what a training call
returns) and the optional `ReportsSpinning`. The `Backend` protocol itself, which names the models, is in
`agentrl.client.model`."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    pass


@dataclass
class TrainResult:
    """The outcome of `model.train`: the step now served, and the step's metrics (a plain record you may
    annotate, as ART's is; changing it changes nothing that was trained or recorded)."""

    step: int
    metrics: dict[str, float] = field(default_factory=dict)
    skipped: bool = False
    """True when no group could train: no update, no new checkpoint, the step unchanged."""
    skip_reason: str | None = None
    """Why a skipped step trained nothing, cause by cause (no groups, not gathered, all failed, ...)."""
    last_judge_error: str | None = None
    """The last error of a judge whose failure dropped a group this step (`metrics["num_groups_judge_failed"]`)."""
    record_error: str | None = None
    """Set when the step happened (and is served) but writing its metrics, trajectories or W&B record failed."""


@runtime_checkable
class ReportsSpinning(Protocol):
    """A backend that knows whether its trainer and a CPU server would spin on each other's cores in a
    pipelined run (`agentrl.foundation.openmp_spin`), on whichever host trains: LocalBackend and RemoteBackend; optional
    for other backends."""

    def pipelined_spin_fix(self) -> str | None:
        """What would stop the trainer and the server stealing each other's cores while both compute, or None
        where nothing needs to change (a GPU server, or OpenMP's spin already bounded where it trains)."""
        ...

    def pipelined_cores(self) -> contextlib.AbstractAsyncContextManager[bool]:
        """Held while a pipelined run trains: what the backend does itself about that spin, yielding whether it
        did anything (LocalBackend computes its trainer on one thread; a RemoteBackend cannot reach its service's)."""
        ...
