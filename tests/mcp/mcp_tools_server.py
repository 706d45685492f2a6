"""A real MCP server (official SDK) for the tests: a working tool, one that raises, one that hangs,
and one that kills its own process. stdio by default; `--port N` serves streamable HTTP."""

from __future__ import annotations

import argparse
import os
import time

from mcp.server.mcpserver import MCPServer

server = MCPServer("test-tools", log_level="WARNING")


@server.tool()
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


@server.tool()
def crash() -> str:
    """A tool with a bug."""
    raise RuntimeError("the tool has a bug")


@server.tool()
def hang() -> str:
    """A tool that never answers."""
    time.sleep(3600)
    return "never"


@server.tool()
def die() -> str:
    """A tool that ends its server."""
    os._exit(3)


@server.resource("notes://readme", description="A short note.")
def readme() -> str:
    return "the answer is 42"


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=None)
    args = parser.parse_args()
    if args.port is None:
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=args.port)
