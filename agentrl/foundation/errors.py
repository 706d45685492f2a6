"""Typed errors: one root, `AgentRLError`, so callers can catch everything agentrl raises in one place."""


class AgentRLError(Exception):
    """Root of every error agentrl raises on purpose."""


class RolloutError(AgentRLError):
    """Rollouts raised more exceptions than the gather's exception budget allows.

    Fix: read the rollouts' own exceptions (the message and the chained cause show them) and fix the rollout, or
    let a share of rollouts fail with `gather_trajectory_groups(..., max_exception_rate=0.1)`."""


class TokenizationError(AgentRLError):
    """A trajectory cannot be turned into training tokens (e.g. an assistant turn without sampled token ids).

    Fix: sample with `model.openai_client()` (it asks the server for token ids and logprobs) and append the
    `Choice` it returns; or skip such turns with `TrainConfig(allow_training_without_logprobs=True)`."""


class ModelNotFoundError(AgentRLError):
    """A base model name is neither a packaged model, a local folder, nor a Hugging Face id.

    Fix: leave `base_model` at its default (the packaged model), give a folder holding a model, or a Hugging Face
    id on a machine that can reach the hub; the message lists the packaged names."""


class ServerError(AgentRLError):
    """The inference server failed to start, died, or refused a request.

    Fix: the message gives the server log's path and its last lines; a dead server is restarted by registering
    the model again (it resumes from the checkpoints on disk)."""


class CheckpointError(AgentRLError):
    """A checkpoint folder is missing, incomplete, or inconsistent with the run.

    Fix: nothing is lost by it. At `register` a bad checkpoint is moved aside (`checkpoints/.corrupt-*`) and the
    newest valid one resumes; a LoRA that does not fit means the run was made with other LoRA settings."""


class JudgeError(AgentRLError):
    """An LLM judge failed to return a valid judgement after its retries.

    Fix: the message names the judge and its last answer or error. Check the judge's credentials and model id;
    `swallow_exceptions=True` drops the group instead, and `TrainConfig.max_judge_failure_rate` bounds how many
    a step may drop."""


class SessionOverflowError(AgentRLError):
    """A rollout session was dropped (too many open) or logged past its bound, so its log is not whole.

    Fix: close sessions when their rollout ends (`async with`), and keep one session per rollout."""


class ConfigurationError(AgentRLError, ValueError):
    """An argument or setting is out of range or means something else here; the message names the fix."""


class RewardError(AgentRLError, ValueError):
    """A trajectory's reward is missing or not a finite number, so it cannot be compared within its group.

    Fix: set `trajectory.reward` to a finite float in every rollout; the message names the group and trajectory."""


class TrainingError(AgentRLError):
    """A training step was aborted (e.g. a non-finite loss or gradient); weights and optimizer are unchanged.

    Fix: call `train` again with the next batch; if it recurs, lower the learning rate or check the rewards'
    scale. Nothing of the aborted step was applied or saved."""


class RunLockedError(AgentRLError):
    """Another process holds the run folder: two writers would corrupt its checkpoints.

    Fix: stop the process the message names (its PID), or give this run another `name`. The lock dies with its
    process, so there is never a stale lock to delete."""


class NotAllowedError(ConfigurationError):
    """A request asks for something the backend's operator did not allow (a base model, server flags, a route
    its token does not open); the message says what is allowed and who can change it."""


class StepConflictError(AgentRLError):
    """A train request was made for a step the model is no longer at (another client trained it, or an earlier
    attempt of the same step was applied); the message says the model's step."""


class BackendBrokenError(AgentRLError):
    """The backend's server or trainer can no longer be trusted (the server died, or a rollback failed); registering
    the model again rebuilds them from the checkpoints on disk."""


class ToolServerError(AgentRLError):
    """An MCP tool server could not be reached, did not start, or died; the message names the server.

    Fix: run the server's command by hand to see why it fails, or check its URL; `tool_timeout_s` bounds a call."""
