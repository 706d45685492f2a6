"""agentrl: train LLM agents with reinforcement learning (GRPO + LoRA), on a laptop CPU or a GPU."""

from agentrl.backend.local import LocalBackend, TrainResult
from agentrl.config import (
    CISPOLoss,
    DROLoss,
    GSPOLoss,
    ImportanceSamplingLoss,
    LoRAConfig,
    PPOLoss,
    ServerConfig,
    TrainConfig,
)
from agentrl.errors import (
    AgentRLError,
    CheckpointError,
    JudgeError,
    ModelNotFoundError,
    RolloutError,
    ServerError,
    TokenizationError,
)
from agentrl.gather import ExceptionBudget, gather_trajectories, gather_trajectory_groups
from agentrl.model import Model, TrainableModel
from agentrl.trajectory import History, RolloutException, Trajectory, TrajectoryGroup

__all__ = [
    "AgentRLError",
    "CISPOLoss",
    "CheckpointError",
    "DROLoss",
    "ExceptionBudget",
    "GSPOLoss",
    "History",
    "ImportanceSamplingLoss",
    "JudgeError",
    "LocalBackend",
    "LoRAConfig",
    "Model",
    "ModelNotFoundError",
    "PPOLoss",
    "RolloutError",
    "RolloutException",
    "ServerConfig",
    "ServerError",
    "TokenizationError",
    "TrainConfig",
    "TrainResult",
    "TrainableModel",
    "Trajectory",
    "TrajectoryGroup",
    "gather_trajectories",
    "gather_trajectory_groups",
]
