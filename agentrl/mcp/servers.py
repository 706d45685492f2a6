"""MCP tool servers as one toolbox: connect over stdio or streamable HTTP, list tools as OpenAI tool
schemas, and run a model's tool calls on the server that owns each tool.

What the model wrote never raises: an unknown tool, arguments that are not a JSON object, a tool
that fails and a tool that runs past its timeout all come back as an error text the model reads.
What the model did not cause raises `ToolServerError`, naming the server: it did not start, or it
died. Every connection is closed (and every stdio process ended) when the `async with` block ends,
on every path.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agentrl.foundation.distribution import install_extra
from agentrl.foundation.errors import ConfigurationError, ToolServerError

try:
    import httpx2
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters, stdio_client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.exceptions import MCPError
    from mcp_types import REQUEST_TIMEOUT, CallToolResult, EmbeddedResource, ImageContent, TextContent
except ImportError as error:  # pragma: no cover - the extra is missing
    raise ImportError(f"agentrl.mcp needs the official MCP SDK: {install_extra('mcp')} (mcp>=2.3)") from error

logger = logging.getLogger(__name__)
READ_RESOURCE_TOOL = "read_resource"


class StdioServer(BaseModel):
    """An MCP server started as a child process that speaks MCP on its stdin/stdout."""

    model_config = ConfigDict(frozen=True)
    kind: Literal["stdio"] = "stdio"
    command: str
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] | None = None
    cwd: str | None = None
    name: str | None = None
    """Prefix for this server's tool names when two servers offer a tool of the same name."""

    def label(self) -> str:
        return self.name or " ".join([self.command, *self.args])[:80]


class HTTPServer(BaseModel):
    """An MCP server already running, reached over streamable HTTP (e.g. http://127.0.0.1:8000/mcp)."""

    model_config = ConfigDict(frozen=True)
    kind: Literal["http"] = "http"
    url: str
    headers: dict[str, str] = Field(default_factory=dict)
    name: str | None = None

    def label(self) -> str:
        return self.name or self.url


ServerSpec = StdioServer | HTTPServer


@dataclass(frozen=True)
class ToolRoute:
    """Where an advertised tool name runs: the server and the tool's own name there."""

    server: int
    name: str


@dataclass
class ToolCallResult:
    """What one tool call gave: the text for the model's tool message, and whether it is an error."""

    content: str
    is_error: bool = False
    timed_out: bool = False
    structured: dict[str, Any] | None = None


def _text_of(result: CallToolResult) -> str:
    parts: list[str] = []
    for block in result.content:
        if isinstance(block, TextContent):
            parts.append(block.text)
        elif isinstance(block, ImageContent):
            parts.append(f"[image {block.mime_type}, {len(block.data)} base64 chars]")
        elif isinstance(block, EmbeddedResource):
            resource = block.resource
            parts.append(getattr(resource, "text", None) or f"[resource {resource.uri}]")
        else:
            parts.append(json.dumps(block.model_dump(mode="json", by_alias=True)))
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content))
    return "\n".join(parts)


def openai_tool(name: str, description: str | None, input_schema: dict[str, Any] | None) -> dict[str, Any]:
    """A tool as a chat-completions tool schema (an object schema when it takes no arguments)."""
    parameters = dict(input_schema or {"type": "object", "properties": {}})
    parameters.setdefault("type", "object")
    parameters.setdefault("properties", {})
    return {"type": "function", "function": {"name": name, "description": description or "", "parameters": parameters}}


@dataclass
class MCPToolbox:
    """Tools of one or several MCP servers, connected for the life of an `async with` block.

    Open one per rollout (`async with MCPToolbox([...]) as tools:` inside the rollout) or one for
    many rollouts (open it around the gather and pass it in): the same object serves both.
    `tools` are OpenAI tool schemas for `chat.completions.create(tools=...)`.
    """

    servers: Sequence[ServerSpec]
    tool_timeout_s: float = 30.0
    connect_timeout_s: float = 60.0
    include_resources: bool = True
    """Offer a `read_resource` tool when a server lists resources (their URIs go in its description)."""
    tools: list[dict[str, Any]] = field(default_factory=list, init=False)
    resources: list[dict[str, Any]] = field(default_factory=list, init=False)
    _routes: dict[str, ToolRoute] = field(default_factory=dict, init=False)
    _resource_servers: dict[str, int] = field(default_factory=dict, init=False)
    _clients: list[Client] = field(default_factory=list, init=False)
    _stack: AsyncExitStack | None = field(default=None, init=False)
    _dead: dict[int, str] = field(default_factory=dict, init=False)
    _stderr: dict[int, Any] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        if not self.servers:
            raise ConfigurationError("MCPToolbox needs at least one server: StdioServer(...) or HTTPServer(url=...)")
        for spec in self.servers:
            if not isinstance(spec, (StdioServer, HTTPServer)):
                raise ConfigurationError(
                    f"{spec!r} is not an MCP server spec: use agentrl.mcp.StdioServer(command=..., args=[...]) "
                    "or agentrl.mcp.HTTPServer(url='http://host:port/mcp')"
                )

    def _client_for(self, index: int, spec: ServerSpec) -> Client:
        if isinstance(spec, StdioServer):
            params = StdioServerParameters(command=spec.command, args=spec.args, env=spec.env, cwd=spec.cwd)
            # A stdio server's stderr goes to a file (a notebook's stderr has no file descriptor to give a
            # child process); its tail is quoted when the server fails.
            self._stderr[index] = tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace")
            return Client(stdio_client(params, errlog=self._stderr[index]), read_timeout_seconds=self.connect_timeout_s)
        http_client = httpx2.AsyncClient(headers=spec.headers, timeout=httpx2.Timeout(self.connect_timeout_s))
        return Client(
            streamable_http_client(spec.url, http_client=http_client), read_timeout_seconds=self.connect_timeout_s
        )

    async def __aenter__(self) -> MCPToolbox:
        self._stack = AsyncExitStack()
        try:
            for index, spec in enumerate(self.servers):
                try:
                    client = await self._stack.enter_async_context(self._client_for(index, spec))
                    listing = await client.list_tools()
                    resources = (
                        await client.list_resources() if self.include_resources and _has_resources(client) else None
                    )
                except (MCPError, OSError, Exception) as error:  # noqa: BLE001  any failure to connect names the server
                    raise ToolServerError(
                        f"could not connect to MCP server {spec.label()!r}: {type(error).__name__}: {error}. "
                        "Check that the command runs on its own (it must speak MCP on stdin/stdout) or that the "
                        f"URL answers (streamable HTTP, usually ending in /mcp).{self._stderr_tail(index)}"
                    ) from error
                self._clients.append(client)
                for tool in listing.tools:
                    self._add_tool(index, spec, tool.name, tool.description, tool.input_schema)
                for resource in resources.resources if resources else []:
                    self._resource_servers[str(resource.uri)] = index
                    self.resources.append(
                        {"uri": str(resource.uri), "name": resource.name, "description": resource.description or ""}
                    )
            if self.resources:
                uris = ", ".join(r["uri"] for r in self.resources)
                self.tools.append(
                    openai_tool(
                        READ_RESOURCE_TOOL,
                        f"Read a resource by its URI. Resources: {uris}",
                        {"type": "object", "properties": {"uri": {"type": "string"}}, "required": ["uri"]},
                    )
                )
        except BaseException:
            await self.aclose()
            raise
        return self

    def _add_tool(self, index: int, spec: ServerSpec, name: str, description: str | None, schema: Any) -> None:
        advertised = name
        if advertised in self._routes or advertised == READ_RESOURCE_TOOL:
            if not spec.name:
                raise ConfigurationError(
                    f"two MCP servers offer a tool named {name!r}: give each server a name= so their tools are "
                    f"told apart (tools become NAME_{name})"
                )
            advertised = f"{spec.name}_{name}"
        self._routes[advertised] = ToolRoute(index, name)
        self.tools.append(openai_tool(advertised, description, schema))

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close every connection and end every stdio server; safe to call twice."""
        stack, self._stack = self._stack, None
        self._clients.clear()
        try:
            if stack is not None:
                await stack.aclose()
        except Exception as error:  # noqa: BLE001  a server that died already cannot be closed cleanly
            logger.debug("closing MCP servers: %s", error)
        finally:
            for errlog in self._stderr.values():
                errlog.close()
            self._stderr.clear()

    def _stderr_tail(self, index: int, lines: int = 15) -> str:
        errlog = self._stderr.get(index)
        if errlog is None or errlog.closed:
            return ""
        errlog.flush()
        errlog.seek(0)
        tail = errlog.read().strip().splitlines()[-lines:]
        return "\nIts stderr ends:\n" + "\n".join(tail) if tail else ""

    @property
    def tool_names(self) -> list[str]:
        return [t["function"]["name"] for t in self.tools]

    async def call(self, name: str, arguments: str | dict[str, Any] | None) -> ToolCallResult:
        """Run one tool call as the model wrote it; errors the model caused come back as error text."""
        if self._stack is None:
            raise ToolServerError("the MCP toolbox is closed: call tools inside `async with MCPToolbox(...)`")
        try:
            args = _parse_arguments(arguments)
        except ValueError as error:
            return ToolCallResult(f"Error: {error}", is_error=True)
        if name == READ_RESOURCE_TOOL and self.resources:
            return await self._read_resource(args)
        route = self._routes.get(name)
        if route is None:
            return ToolCallResult(f"Error: unknown tool {name!r}; the tools are {self.tool_names}", is_error=True)
        self._raise_if_dead(route.server)
        try:
            result = await self._clients[route.server].call_tool(
                route.name, args, read_timeout_seconds=self.tool_timeout_s
            )
        except MCPError as error:
            if error.error.code == REQUEST_TIMEOUT:
                return ToolCallResult(
                    f"Error: tool {name!r} did not answer within {self.tool_timeout_s:g} s",
                    is_error=True,
                    timed_out=True,
                )
            self._check_alive(route.server, error)
            return ToolCallResult(f"Error: {error.error.message}", is_error=True)
        except Exception as error:  # noqa: BLE001  transport failures: the server is gone
            self._check_alive(route.server, error)
            raise
        text = _text_of(result)
        return ToolCallResult(
            f"Error: {text}" if result.is_error and not text.startswith("Error") else text,
            is_error=bool(result.is_error),
            structured=result.structured_content,
        )

    async def _read_resource(self, args: dict[str, Any]) -> ToolCallResult:
        uri = str(args.get("uri", ""))
        server = self._resource_servers.get(uri)
        if server is None:
            known = [r["uri"] for r in self.resources]
            return ToolCallResult(f"Error: no resource {uri!r}; the resources are {known}", is_error=True)
        self._raise_if_dead(server)
        try:
            result = await self._clients[server].read_resource(uri)
        except MCPError as error:
            self._check_alive(server, error)
            return ToolCallResult(f"Error: {error.error.message}", is_error=True)
        except Exception as error:  # noqa: BLE001
            self._check_alive(server, error)
            raise
        return ToolCallResult("\n".join(getattr(c, "text", None) or f"[binary {c.uri}]" for c in result.contents))

    def _raise_if_dead(self, server: int) -> None:
        if server in self._dead:
            raise ToolServerError(self._dead[server])

    def _check_alive(self, server: int, error: BaseException) -> None:
        """A closed connection means the server died: raise, naming it (the model did not cause this)."""
        closed = isinstance(error, MCPError) and "closed" in error.error.message.lower()
        if closed or not isinstance(error, MCPError):
            label = self.servers[server].label()
            self._dead[server] = (
                f"MCP server {label!r} is gone ({type(error).__name__}: {error}); its tools cannot run. "
                f"A stdio server that exits or crashes ends the connection.{self._stderr_tail(server)}"
            )
            raise ToolServerError(self._dead[server]) from error


def _has_resources(client: Client) -> bool:
    try:
        return client.server_capabilities.resources is not None
    except Exception:  # noqa: BLE001  capabilities unknown: do not ask
        return False


def _parse_arguments(arguments: str | dict[str, Any] | None) -> dict[str, Any]:
    if arguments is None:
        return {}
    if isinstance(arguments, dict):
        return arguments
    try:
        parsed = json.loads(arguments) if arguments.strip() else {}
    except (ValueError, RecursionError):
        raise ValueError(f"the arguments are not valid JSON: {arguments[:200]!r}") from None
    if not isinstance(parsed, dict):
        raise ValueError("the arguments must be a JSON object")
    return parsed
