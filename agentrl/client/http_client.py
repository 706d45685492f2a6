"""The HTTP client a model's openai client uses: pooled, naming each request's rollout for the token
ledger, and saying what happened when our own server dies or hangs."""

from __future__ import annotations

import httpx2
import openai

from agentrl.foundation.endpoint import InferenceEndpoint
from agentrl.foundation.rollout_id import ROLLOUT_HEADER, current_rollout


class _BackendTransport(httpx2.AsyncBaseTransport):
    """A backend client's requests: each names its rollout (`ROLLOUT_HEADER`, for the token ledger), and a
    failed one to our own server becomes an answer that says what happened to it.

    A dead server would otherwise surface as openai's bare "Connection error." after its retries,
    and a hung one would hold each rollout for the timeout times three. `death_notice` returns None
    while the server runs, else its exit and log tail. The answer carries `x-should-retry: false`,
    so the openai client raises at once (`InternalServerError`, the message in its body).
    """

    def __init__(self, inner: httpx2.AsyncBaseTransport, endpoint: InferenceEndpoint, timeout_s: float):
        self.inner = inner
        self.death_notice = endpoint.death_notice
        self.recent_log = endpoint.recent_log
        self.timeout_s = timeout_s

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if (rollout_id := current_rollout.get()) is not None:
            request.headers[ROLLOUT_HEADER] = rollout_id  # the gateway tallies the rollout's tokens (the ledger)
        try:
            return await self.inner.handle_async_request(request)
        except httpx2.TimeoutException as error:
            if self.death_notice is None:
                raise  # a backend that cannot tell (remote): openai's own timeout error
            if (notice := self.death_notice()) is not None:
                return _error_response(request, 504, notice)
            message = (
                f"the vLLM server at {request.url.host}:{request.url.port} is running but gave no answer within "
                f"{self.timeout_s:.0f} s ({type(error).__name__}); it may be hung or overloaded (raise "
                "ServerConfig.request_timeout_s for long generations)"
            )
            if self.recent_log is not None:  # its queue and throughput: hung, or just busy?
                message += f"; the server's log {self.recent_log()}"
            return _error_response(request, 504, message)
        except httpx2.TransportError:
            if self.death_notice is None or (notice := self.death_notice()) is None:
                raise  # a running server: a passing network error, which the client retries
            return _error_response(request, 503, notice)

    async def aclose(self) -> None:
        await self.inner.aclose()


def _error_response(request: httpx2.Request, status: int, message: str) -> httpx2.Response:
    body = {"error": {"message": message, "type": "server_unavailable", "code": status}}
    return httpx2.Response(status, json=body, headers={"x-should-retry": "false"}, request=request)


MAX_CONNECTIONS = 64


def pooled_http_client(*, timeout_s: float = 600.0, endpoint: InferenceEndpoint | None = None) -> httpx2.AsyncClient:
    """At most MAX_CONNECTIONS sockets; further requests wait for a free one (no pool timeout). httpx2, the
    HTTP client openai 3 is built on and types its `http_client` with.

    With a backend's `endpoint` that can tell, a dead or hung server is reported as such (see
    `_BackendTransport`). Token data needs nothing here: the backend's gateway asks for it.
    """
    limits = httpx2.Limits(max_connections=MAX_CONNECTIONS, max_keepalive_connections=MAX_CONNECTIONS)
    transport: httpx2.AsyncBaseTransport = httpx2.AsyncHTTPTransport(limits=limits)
    if endpoint is not None:
        transport = _BackendTransport(transport, endpoint, timeout_s)
    return httpx2.AsyncClient(transport=transport, timeout=httpx2.Timeout(timeout_s, connect=30.0, pool=None))


def endpoint_client(endpoint: InferenceEndpoint, *, timeout_s: float) -> openai.AsyncOpenAI:
    """An openai client for a backend's gateway (which keeps every completion's token data): its token,
    and a dead or hung server reported as such within `timeout_s` (openai's own timeout overrides httpx's)."""
    http_client = pooled_http_client(timeout_s=timeout_s, endpoint=endpoint)
    return openai.AsyncOpenAI(
        base_url=endpoint.base_url, api_key=endpoint.api_key, http_client=http_client, timeout=timeout_s
    )
