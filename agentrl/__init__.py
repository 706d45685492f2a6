"""agentrl: train LLM agents with reinforcement learning (GRPO + LoRA), on a laptop CPU or a GPU."""

from importlib import metadata as _metadata
from typing import TYPE_CHECKING

from agentrl.backend.remote.client import RemoteBackend
from agentrl.backend.training.ranks.rank_hosts import JoinPoint
from agentrl.client.backend_protocol import TrainResult
from agentrl.client.capture import capture_trajectory, current_trajectory, no_capture
from agentrl.client.dataset import DatasetBatch, iterate_dataset
from agentrl.client.gather import AfterEach, ExceptionBudget, gather_trajectories, gather_trajectory_groups
from agentrl.client.model import Backend, JudgeModel, Model, TrainableModel
from agentrl.client.pipeline import train_pipelined
from agentrl.client.weave_tracing import disable_weave, enable_weave, traced
from agentrl.data.trajectory import History, Trajectory
from agentrl.data.trajectory_group import RolloutException, TrajectoryGroup
from agentrl.foundation.call_helpers import limit_concurrency, retry
from agentrl.foundation.config import (
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
from agentrl.foundation.distribution import DISTRIBUTION as _DISTRIBUTION
from agentrl.foundation.errors import (
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
    SessionOverflowError,
    StepConflictError,
    TokenizationError,
    TrainingError,
)
from agentrl.foundation.plugins import EnvironmentCommands
from agentrl.foundation.stop_signals import handle_stop_signals
from agentrl.gateway.limits import GatewayLimits
from agentrl.records.run_folder import DEFAULT_BASE_PATH, RunFolder

if TYPE_CHECKING:  # the names `_LAZY` loads on first use, for type checkers (explicitly re-exported)
    from agentrl.backend.local import LocalBackend as LocalBackend
    from agentrl.judge_training import train_judge as train_judge
    from agentrl.judge_training import train_judge_rl as train_judge_rl
    from agentrl.judge_training import train_verdict_judge as train_verdict_judge
    from agentrl.judges import JudgeAudit as JudgeAudit
    from agentrl.judges import JudgeCheckReport as JudgeCheckReport
    from agentrl.judges import JudgeExample as JudgeExample
    from agentrl.judges import JudgeLimiter as JudgeLimiter
    from agentrl.judges import RubricTask as RubricTask
    from agentrl.judges import VerdictExample as VerdictExample
    from agentrl.judges import check_judge as check_judge
    from agentrl.judges import judge_rubrics as judge_rubrics
    from agentrl.judges import load_rubric_tasks as load_rubric_tasks
    from agentrl.judges import rubric_rollout as rubric_rollout
    from agentrl.judges import ruler_score_group as ruler_score_group
    from agentrl.judges.ruler import ruler as ruler  # the function, not its module

try:
    __version__ = _metadata.version(_DISTRIBUTION)
except _metadata.PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0.0.0+unknown"

# Loaded on first use, not with `import agentrl`: the judges load litellm (2.5 s to import), and the local
# backend loads torch, transformers and peft, which a client of a remote backend does not install. They are
# the public names (`__all__`, below) not defined by the imports above; the TYPE_CHECKING imports type them.
_LAZY_MODULES = {
    "LocalBackend": "agentrl.backend.local",
    **dict.fromkeys(("train_judge", "train_judge_rl", "train_verdict_judge"), "agentrl.judge_training"),
}
"""Where a lazily loaded name lives, where it is not `agentrl.judges`."""


def __getattr__(name: str) -> object:
    if name in _LAZY:  # defined below __all__, from it
        import importlib

        from agentrl.backend.extras import missing_backend_extra

        with missing_backend_extra(name):
            return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'agentrl' has no attribute {name!r}")


__all__ = [
    "AfterEach",
    "EnvironmentCommands",
    "JudgeModel",
    "JoinPoint",
    "handle_stop_signals",
    "DEFAULT_BASE_PATH",
    "RunFolder",
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
    "SessionOverflowError",
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
    "no_capture",
    "DatasetBatch",
    "iterate_dataset",
    "limit_concurrency",
    "retry",
    "disable_weave",
    "enable_weave",
    "gather_trajectories",
    "gather_trajectory_groups",
    "traced",
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
    "train_verdict_judge",
    "VerdictExample",
    "LocalBackend",
]
_LAZY = {name: _LAZY_MODULES.get(name, "agentrl.judges") for name in __all__ if name not in globals()}
