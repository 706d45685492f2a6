"""The name agentrl installs under, and the command that installs one of its extras, for every message that
says what to install.

The import name is `agentrl`; the distribution is `agent-grpo` (as scikit-learn installs `sklearn`): `agentrl` on
the package index is an unrelated project, and `agentrl-*` names belong to another framework called AgentRL.
"""

DISTRIBUTION = "agent-grpo"


def install_extra(extra: str) -> str:
    """`pip install 'agent-grpo[extra]'`: what adds an optional extra (`mcp`, `s3`, `cpu`, ...) to an install."""
    return f"pip install '{DISTRIBUTION}[{extra}]'"
