"""The email inbox as an MCP server: `search_emails` and `read_email` over one inbox, on stdio or HTTP.

python -m agentrl_environments.email_agent.mcp_server --database DB --inbox ADDRESS            (stdio)
python -m agentrl_environments.email_agent.mcp_server --database DB --inbox ADDRESS --port N   (HTTP, 127.0.0.1:N/mcp)

DB is the email environment's SQLite file (`EmailEnvironment.load().database`). The server imports
only the mailbox and the MCP SDK, so a client that starts one per rollout waits about a second.

Written with the official MCP SDK, so any MCP client (agentrl.mcp, an IDE, another framework) can
use the same tools the native email environment gives its agent; the questions' known answers make
a verifiable check beside RULER when agentrl trains on it (`agentrl_environments.email_agent.mcp_rl`).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from .mailbox import Mailbox


def build_server(database: Path, inbox: str) -> MCPServer:
    """An MCP server whose tools search and read `inbox` of `database` (read-only)."""
    if not database.is_file():
        raise SystemExit(
            f"no email database at {database}: build it with EmailEnvironment.load() and pass its .database"
        )
    mailbox = Mailbox(database, inbox)
    if mailbox.db.execute("SELECT 1 FROM messages WHERE inbox = ? LIMIT 1", (inbox,)).fetchone() is None:
        raise SystemExit(f"no inbox {inbox!r} in {database}; pass one of the questions' inbox addresses")
    server = MCPServer(
        "email-inbox", instructions=f"The inbox of {inbox}: search it and read its emails.", log_level="WARNING"
    )

    @server.tool()
    def search_emails(
        keywords: str,
        from_addr: str | None = None,
        sent_after: str | None = None,
        sent_before: str | None = None,
        max_results: int = 10,
    ) -> str:
        """Search the inbox. Returns message ids, subjects and snippets of emails containing all the keywords."""
        hits = mailbox.search(
            keywords,
            from_addr=from_addr,
            sent_after=sent_after,
            sent_before=sent_before,
            max_results=max(1, min(max_results, 50)),
        )
        return json.dumps([asdict(h) for h in hits]) if hits else "No emails found. Try fewer or other keywords."

    @server.tool()
    def read_email(message_id: str) -> str:
        """Read one email by its message id."""
        email = mailbox.read(message_id)
        if email is None:
            raise ToolError(f"No email with id {message_id!r} in this inbox.")
        return json.dumps(email)

    @server.resource("inbox://owner", description="Whose inbox this is.")
    def owner() -> str:
        return inbox

    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", required=True, type=Path, help="the email environment's SQLite file")
    parser.add_argument("--inbox", required=True, help="the inbox's owner address, e.g. jonas.garcia@tailspin.com")
    parser.add_argument("--port", type=int, default=None, help="serve streamable HTTP on 127.0.0.1:PORT/mcp")
    args = parser.parse_args()
    server = build_server(args.database, args.inbox)
    if args.port is None:
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()
