"""agentrl: train LLM agents with reinforcement learning (GRPO + LoRA), on a laptop CPU or a GPU."""

from importlib import metadata as _metadata

from agentrl.backend.local import LocalBackend
from agentrl.backend.protocol import Backend
from agentrl.backend.remote import RemoteBackend
from agentrl.call_helpers import limit_concurrency, retry
from agentrl.capture import capture_trajectory, current_trajectory
from agentrl.config import (
    CISPOLoss,
    DROLoss,
    GSPOLoss,
    ImportanceSamplingLoss,
    LoRAConfig,
    PPOLoss,
    ServerConfig,
    SFTConfig,
    TrainConfig,
)
from agentrl.dataset import DatasetBatch, iterate_dataset
from agentrl.errors import (
    AgentRLError,
    BackendBrokenError,
    CheckpointError,
    ConfigurationError,
    JudgeError,
    ModelNotFoundError,
    NotAllowedError,
    RewardError,
    RolloutError,
    RunLockedError,
    ServerError,
    StepConflictError,
    TokenizationError,
    TrainingError,
)
from agentrl.gateway.limits import GatewayLimits
from agentrl.gather import ExceptionBudget, gather_trajectories, gather_trajectory_groups
from agentrl.model import Model, TrainableModel, TrainResult
from agentrl.pipeline import train_pipelined
from agentrl.trajectory import History, RolloutException, Trajectory, TrajectoryGroup
from agentrl.weave_tracing import disable_weave, enable_weave, traced

try:
    __version__ = _metadata.version("agentrl")
except _metadata.PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0.0.0+unknown"

# Judges load litellm (2.5 s to import): they are loaded on first use, not with `import agentrl`.
_LAZY = {
    name: "agentrl.judges"
    for name in (
        "JudgeAudit",
        "JudgeCheckReport",
        "JudgeExample",
        "JudgeLimiter",
        "RubricTask",
        "check_judge",
        "judge_rubrics",
        "load_rubric_tasks",
        "rubric_rollout",
        "ruler",
        "ruler_score_group",
        "train_judge",
        "train_judge_rl",
    )
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'agentrl' has no attribute {name!r}")


__all__ = [
    "AgentRLError",
    "Backend",
    "BackendBrokenError",
    "GatewayLimits",
    "NotAllowedError",
    "StepConflictError",
    "CISPOLoss",
    "CheckpointError",
    "ConfigurationError",
    "DROLoss",
    "ExceptionBudget",
    "GSPOLoss",
    "History",
    "ImportanceSamplingLoss",
    "JudgeError",
    "LocalBackend",
    "RemoteBackend",
    "LoRAConfig",
    "Model",
    "ModelNotFoundError",
    "PPOLoss",
    "RewardError",
    "RolloutError",
    "RunLockedError",
    "RolloutException",
    "ServerConfig",
    "ServerError",
    "SFTConfig",
    "TokenizationError",
    "TrainConfig",
    "TrainResult",
    "train_pipelined",
    "TrainingError",
    "TrainableModel",
    "Trajectory",
    "TrajectoryGroup",
    "capture_trajectory",
    "current_trajectory",
    "DatasetBatch",
    "iterate_dataset",
    "limit_concurrency",
    "retry",
    "disable_weave",
    "enable_weave",
    "gather_trajectories",
    "gather_trajectory_groups",
    "traced",
    *_LAZY,
]
