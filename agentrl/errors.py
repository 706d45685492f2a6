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
