"""ART's `art.utils.deployment`: its types as ART names them, so scripts that import them run; deploying a
checkpoint to a hosted provider (Together, W&B Inference) is not something agentrl does, so `deploy_model` and
`deploy_wandb` raise `ConfigurationError` naming themselves and what to do instead: serve a checkpoint with
`agentrl serve PROJECT/NAME --step N` (an OpenAI-compatible server), or upload the checkpoint folder (peft's
format) to the provider with its own tools."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel

from agentrl.foundation.errors import ConfigurationError

from .wandb import WandbDeploymentConfig, deploy_wandb

__all__ = [
    "DeploymentConfig",
    "DeploymentResult",
    "LoRADeploymentJob",
    "LoRADeploymentProvider",
    "Provider",
    "TogetherDeploymentConfig",
    "WandbDeploymentConfig",
    "deploy_model",
    "deploy_wandb",
]

Provider = Literal["together", "wandb"]


class DeploymentConfig(BaseModel):
    """A provider's deployment settings (ART's base class)."""


class DeploymentResult(BaseModel):
    """What a deployment gives: the model name to send for inference."""

    inference_model_name: str


class TogetherDeploymentConfig(DeploymentConfig):
    """ART's settings for Together: where the checkpoint archive is uploaded, and whether to wait."""

    s3_bucket: str | None = None
    prefix: str | None = None
    wait_for_completion: bool = True


class LoRADeploymentProvider(StrEnum):
    """ART's older provider names."""

    TOGETHER = "together"
    WANDB = "wandb"


class LoRADeploymentJob(BaseModel):
    """ART's older deployment job record."""

    status: str
    job_id: str
    model_name: str
    failure_reason: str | None = None


async def deploy_model(
    model: Any,
    checkpoint_path: str,
    step: int,
    provider: Provider,
    config: DeploymentConfig | None = None,
    verbose: bool = False,
) -> DeploymentResult:
    """ART deploys a checkpoint to a hosted provider here; agentrl does not (see the module's docstring)."""
    raise ConfigurationError(
        f"art.utils.deployment.deploy_model(provider={provider!r}) has no counterpart in agentrl: serve the "
        f"checkpoint with `agentrl serve {getattr(model, 'project', 'PROJECT')}/{getattr(model, 'name', 'NAME')} "
        f"--step {step}`, or upload {checkpoint_path} (peft's adapter format) with the provider's own tools"
    )
