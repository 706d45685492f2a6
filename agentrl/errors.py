"""Typed errors: one root, `AgentRLError`, so callers can catch everything agentrl raises in one place."""


class AgentRLError(Exception):
    """Root of every error agentrl raises on purpose."""


class RolloutError(AgentRLError):
    """Rollouts raised more exceptions than the gather's exception budget allows."""


class TokenizationError(AgentRLError):
    """A trajectory cannot be turned into training tokens (e.g. an assistant turn without sampled token ids)."""


class ModelNotFoundError(AgentRLError):
    """A base model name is neither a packaged model, a local folder, nor a Hugging Face id."""


class ServerError(AgentRLError):
    """The inference server failed to start, died, or refused a request."""


class CheckpointError(AgentRLError):
    """A checkpoint folder is missing, incomplete, or inconsistent with the run."""


class JudgeError(AgentRLError):
    """An LLM judge failed to return a valid judgement after its retries."""


class SessionOverflowError(AgentRLError):
    """A rollout session was dropped (too many open) or logged past its bound, so its log is not whole."""


class ConfigurationError(AgentRLError, ValueError):
    """An argument or setting is out of range or means something else here; the message names the fix."""


class RewardError(AgentRLError, ValueError):
    """A trajectory's reward is missing or not a finite number, so it cannot be compared within its group."""


class TrainingError(AgentRLError):
    """A training step was aborted (e.g. a non-finite loss or gradient); weights and optimizer are unchanged."""


class RunLockedError(AgentRLError):
    """Another process holds the run folder: two writers would corrupt its checkpoints."""


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
    """An MCP tool server could not be reached, did not start, or died; the message names the server."""
