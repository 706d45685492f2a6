"""ART's `art.utils.deployment.wandb`: W&B Inference deployment; agentrl does not deploy (`deploy_wandb` raises)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from agentrl.foundation.errors import ConfigurationError


class WandbDeploymentConfig(BaseModel):
    """ART's settings for W&B: the training provenance recorded with the artifact."""

    provenance: list[str]


def deploy_wandb(
    model: Any, checkpoint_path: str, step: int, config: WandbDeploymentConfig | None = None, verbose: bool = False
) -> Any:
    """ART uploads a checkpoint as a W&B LoRA artifact here; agentrl does not deploy."""
    raise ConfigurationError(
        "art.utils.deployment.wandb.deploy_wandb has no counterpart in agentrl: log the checkpoint folder "
        f"{checkpoint_path} as a W&B artifact yourself (wandb.Artifact(type='lora')), or serve it with `agentrl serve`"
    )
