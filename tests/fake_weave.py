"""A local HTTP server speaking the parts of the W&B/Weave protocol that `weave.init` and tracing use.

It stands in for the paid W&B service at the HTTP boundary: GraphQL for the project and user, the
trace server's info, file and object uploads (ops are stored as objects), and the batches of
finished calls, which it keeps in `calls` for the test to read.
"""

from __future__ import annotations

import json
import re
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.helpers import serve_in_thread


class FakeWeave:
    def __init__(self, entity: str = "me", project: str = "agentrl-test") -> None:
        self.entity, self.project = entity, project
        self.calls: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        serve_in_thread(self.httpd)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def environment(self) -> dict[str, str]:
        """Environment variables that point wandb and weave here."""
        return {
            "WANDB_API_KEY": "k" * 40,
            "WANDB_BASE_URL": self.url,
            "WF_TRACE_SERVER_URL": f"{self.url}/traces",
            "WEAVE_PRINT_CALL_LINK": "false",
        }

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def _reply(self, path: str, body: bytes) -> dict[str, Any]:
        if path == "/graphql":
            return {
                "data": {
                    "project": {"name": self.project},
                    "viewer": {"username": self.entity, "defaultEntity": {"name": self.entity}},
                }
            }
        if path.endswith("/server_info"):
            return {"min_required_weave_python_version": "0.0.1", "trace_server_version": "999.0.0"}
        if path.endswith("/file/create"):
            digest = re.search(rb'name="expected_digest"\r\n\r\n([^\r]+)', body)
            return {"digest": digest.group(1).decode() if digest else "file"}
        if path.endswith("/obj/create"):
            return {"digest": "object"}
        if path.endswith("/calls/complete"):
            self.calls.extend(json.loads(body)["batch"])
        return {}

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self):
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                fake.paths.append(self.path)
                data = json.dumps(fake._reply(self.path, body)).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = _serve  # noqa: N815

            def log_message(self, *args):
                pass

        return Handler
