"""Tools from MCP servers: connect (stdio or streamable HTTP), offer their tools to the model, run
its tool calls, and train on any server with MCP-RL. Needs the `mcp` extra (`pip install 'agent-grpo[mcp]'`)."""

from agentrl.foundation.errors import ToolServerError
from agentrl.mcp.agent import COMPLETE_TASK_TOOL, run_agent
from agentrl.mcp.recipe import MCPRLConfig, MCPRLReport, Score, mcp_rollout, train_mcp_rl
from agentrl.mcp.servers import HTTPServer, MCPToolbox, ServerSpec, StdioServer, ToolCallResult
from agentrl.mcp.tasks import MCPTask, generate_tasks

__all__ = [
    "COMPLETE_TASK_TOOL",
    "HTTPServer",
    "MCPRLConfig",
    "MCPRLReport",
    "MCPTask",
    "MCPToolbox",
    "Score",
    "ServerSpec",
    "StdioServer",
    "ToolCallResult",
    "ToolServerError",
    "generate_tasks",
    "mcp_rollout",
    "run_agent",
    "train_mcp_rl",
]
