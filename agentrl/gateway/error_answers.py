"""How the gateway says no: an error answer in OpenAI's shape, or Anthropic's for the Messages API, and the
message of an inference server's own error answer."""

from __future__ import annotations

import json
from collections.abc import Callable

from starlette.responses import JSONResponse

from agentrl.gateway.client_apis import ClientApi


def gateway_error(status: int, message: str) -> JSONResponse:
    """An error answer in OpenAI's shape (`{"error": {"message", "type", "code"}}`), which every OpenAI client shows."""
    return JSONResponse({"error": {"message": message, "type": "gateway_error", "code": status}}, status_code=status)


def anthropic_error(status: int, message: str) -> JSONResponse:
    """An error as the Messages API words it, so the Anthropic SDK shows the message."""
    kind = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error"}
    error = {"type": kind.get(status, "api_error"), "message": message}
    return JSONResponse({"type": "error", "error": error}, status_code=status)


def refusal(api: ClientApi) -> Callable[[int, str], JSONResponse]:
    """How `api` says no: Anthropic's error shape for Messages, OpenAI's for the others."""
    return anthropic_error if api.anthropic_errors else gateway_error


def upstream_message(content: bytes) -> str:
    """The message of an inference server's error answer (its JSON `message`, else its text)."""
    try:
        data = json.loads(content)
        error = data.get("error", data) if isinstance(data, dict) else {}
        return str(error.get("message") or data)
    except (json.JSONDecodeError, AttributeError):
        return content.decode("utf-8", "replace")
