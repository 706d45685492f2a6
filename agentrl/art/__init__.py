"""ART's public API (OpenPipe ART 0.5.23 and 0.5.18, and the older forms scripts still use) on top of agentrl:
code written for ART runs after changing only its imports.

    import agentrl.art as art                          # was: import art
    from agentrl.art.local import LocalBackend         # was: from art.local import LocalBackend
    from agentrl.art.rewards import ruler_score_group  # was: from art.rewards import ruler_score_group
    from agentrl.art.utils import iterate_dataset      # was: from art.utils import iterate_dataset

Every name maps onto agentrl's own API with ART's parameters, defaults and return shapes (docs/coming-from-art.md).
Training trains as ART's LocalBackend does (CISPO, an AdamW step per trajectory); a setting agentrl cannot honour
raises a `ConfigurationError` naming it and what to do instead, and the backends agentrl does not
run (Serverless, Megatron, Tinker, Unsloth) import but raise when used. Written from ART's public
interface, not from its code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentrl.client.backend_protocol import TrainResult
from agentrl.client.model import Backend
from agentrl.data.trajectory import History
from agentrl.data.trajectory_group import TrajectoryGroup

from . import dev
from .gather import (
    auto_trajectory,
    capture_auto_trajectory,
    capture_yielded_trajectory,
    gather_trajectories,
    gather_trajectory_groups,
    trajectory_group_batches,
    yield_trajectory,
)
from .metrics import (
    PIPELINE_RL_DASHBOARD_DEFAULT_METRICS,
    PIPELINE_RL_METRIC_DEFINITIONS,
    PIPELINE_RL_SCORE_METRICS,
    MetricDefinition,
)
from .models import TrainableModel, agentrl_metric
from .pipeline_trainer import PipelineAutotuneConfig, PipelineRuntimeConfig
from .prompted import Model
from .tokenizer import get_tokenizer
from .training import TrainConfig
from .trajectories import (
    LegacyHistory,
    Trajectory,
    current_trajectory,
    no_capture,
    trajectory,
    trajectory_group,
)
from .types import LoRAConfig, Messages, MessagesAndChoices, Tools, TrainSFTConfig
from .unsupported import (
    LocalServingUnavailableError,
    MegatronRuntimeConfig,
    MegatronTopologyConfig,
    ServerlessBackend,
    get_megatron_runtime_config,
    init_megatron_runtime_config,
    tensorize,
    tokenize,
)
from .utils.retry import retry

if TYPE_CHECKING:
    from .local import LocalBackend, LocalTrainResult

ServerlessTrainResult = TrainResult
"""ART's serverless result type: agentrl's `TrainResult` (ServerlessBackend itself raises)."""

__all__ = [
    "dev",
    "auto_trajectory",
    "capture_auto_trajectory",
    "gather_trajectories",
    "gather_trajectory_groups",
    "trajectory_group_batches",
    "Backend",
    "LocalBackend",
    "LocalTrainResult",
    "LoRAConfig",
    "MegatronTopologyConfig",
    "ServerlessBackend",
    "ServerlessTrainResult",
    "Messages",
    "MessagesAndChoices",
    "Tools",
    "Model",
    "TrainableModel",
    "retry",
    "TrainSFTConfig",
    "TrainConfig",
    "TrainResult",
    "Trajectory",
    "TrajectoryGroup",
    "capture_yielded_trajectory",
    "yield_trajectory",
    "History",
    "LegacyHistory",
    "agentrl_metric",
    "trajectory",
    "trajectory_group",
    "current_trajectory",
    "no_capture",
    "tokenize",
    "tensorize",
    "get_tokenizer",
    "LocalServingUnavailableError",
    "MegatronRuntimeConfig",
    "init_megatron_runtime_config",
    "get_megatron_runtime_config",
    "PipelineRuntimeConfig",
    "PipelineAutotuneConfig",
    "MetricDefinition",
    "PIPELINE_RL_DASHBOARD_DEFAULT_METRICS",
    "PIPELINE_RL_METRIC_DEFINITIONS",
    "PIPELINE_RL_SCORE_METRICS",
]


def __getattr__(name: str) -> object:
    """`LocalBackend` on first use: it needs the training backend (the `cpu` extra), which ART's client API does not."""
    if name in ("LocalBackend", "LocalTrainResult"):
        from . import local

        return getattr(local, name)
    raise AttributeError(f"module 'agentrl.art' has no attribute {name!r}")
