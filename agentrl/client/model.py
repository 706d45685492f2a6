"""Models: `Model` is any OpenAI-compatible endpoint; `TrainableModel` is one we train with a backend.

`Backend` is the seam between a model and whatever serves and trains it: `TrainableModel` depends on
this protocol alone, never on a concrete backend, so the same model (and the user's rollout code)
works with `LocalBackend` in this process, `RemoteBackend` on another host, or a fake in unit tests.

A `TrainableModel` is served by its backend under `inference_name` = "{name}@{step}", the LoRA of
its latest checkpoint. Its `openai_client()` asks the server for the sampled token ids and
logprobs on every chat completion, so the Choices a rollout keeps are ready for training.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import openai
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, SecretStr, ValidationInfo, field_validator

from agentrl.client.backend_protocol import TrainResult
from agentrl.client.http_client import endpoint_client, pooled_http_client
from agentrl.data.trajectory import Trajectory
from agentrl.data.trajectory_group import TrajectoryGroup
from agentrl.foundation.config import LoRAConfig, ServerConfig, SFTConfig, TrainConfig
from agentrl.foundation.endpoint import InferenceEndpoint
from agentrl.foundation.errors import AgentRLError, ConfigurationError
from agentrl.foundation.files import check_safe_name
from agentrl.foundation.sampled_record import served_name
from agentrl.records.run_folder import DEFAULT_BASE_PATH, RunFolder
from agentrl.records.scenario_record import group_scenarios, record_step, trained_scenarios, void_after
from agentrl.records.tracking import DEFAULT_BEST_BY

if TYPE_CHECKING:
    from agentrl.client.rollout_session import RolloutSession
    from agentrl.data.trajectory import History


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
    api_key: SecretStr | None = None
    """API key for the endpoint (None: the provider's environment variable); never shown in reprs or logs."""
    litellm_provider: str = "openai"
    """litellm route prefix for this endpoint: "openai", "hosted_vllm", "anthropic", ..."""
    config: Any = None
    """Your own settings for this model's rollouts (a pydantic model or dict): kept with the model, never
    read by agentrl, so a rollout gets them from `model.config` (typed when you pass a typed object)."""

    _clients: dict[tuple[int, str | None], openai.AsyncOpenAI] = PrivateAttr(default_factory=dict)

    @property
    def inference_name(self) -> str:
        """The `model=` to send in chat-completion requests."""
        return self.inference_model_name or self.name

    def openai_client(self) -> openai.AsyncOpenAI:
        """An `openai.AsyncOpenAI` for this model's endpoint, shared by all rollouts on this event loop.

        One client means one bounded connection pool: hundreds of concurrent rollouts queue for a
        connection instead of opening hundreds of sockets at once (which a busy server drops). Called outside an
        event loop (a script's set-up, as ART allows), a client of its own: a pool belongs to the loop that uses it.
        """
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return self._make_client()
        key = (id(loop), self._endpoint())
        if key not in self._clients:
            self._clients[key] = self._make_client()
        return self._clients[key]

    def _endpoint(self) -> str | None:
        return self.base_url

    def _make_client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=self.base_url, api_key=self._key() or "EMPTY", http_client=pooled_http_client()
        )

    def _key(self) -> str | None:
        return self.api_key.get_secret_value() if self.api_key is not None else None

    def litellm_params(self) -> dict[str, Any]:
        """Keyword arguments for `litellm.acompletion` that reach this model."""
        params: dict[str, Any] = {"model": f"{self.litellm_provider}/{self.inference_name}"}
        if self.base_url:
            params["api_base"] = self.base_url
        if self._key():
            params["api_key"] = self._key()
        return params


JudgeModel = str | Model
"""A judge: a litellm model id ("openai/o4-mini", "hosted_vllm/qwen", "ollama/qwen2.5") or an agentrl Model."""


@runtime_checkable
class Backend(Protocol):
    """Serves a `TrainableModel`'s latest checkpoint and trains it. Every call that waits is async."""

    async def register(self, model: TrainableModel) -> int:
        """Take the model's run, resume its latest checkpoint (or create step 0), serve it; returns the step."""
        ...

    async def get_step(self, model: TrainableModel) -> int:
        """The step of the checkpoint now served."""
        ...

    async def train(
        self,
        model: TrainableModel,
        groups: list[TrajectoryGroup],
        config: TrainConfig,
        *,
        step_metrics: dict[str, float] | None = None,
        dropped: Sequence[TrajectoryGroup] = (),
    ) -> TrainResult:
        """One GRPO step; the new checkpoint is served when it returns (or the skip says why). `step_metrics`
        are recorded with the step's own; `dropped` are groups the caller sampled for this step and did not
        give it (a pipeline's stale ones): their tokens count in the step's ledger."""
        ...

    async def train_sft(self, model: TrainableModel, histories: list[History], config: SFTConfig) -> TrainResult:
        """Supervised training on demonstrations, checkpointed and served like a step."""
        ...

    async def log(self, model: TrainableModel, groups: list[TrajectoryGroup], split: str) -> dict[str, float]:
        """Record evaluation groups at the current step; returns their averaged metrics."""
        ...

    async def delete_checkpoints(self, model: TrainableModel, *, keep_last: int, best_by: str | None) -> list[int]:
        """Delete old checkpoints but the last `keep_last` and the best by `best_by`; returns deleted steps."""
        ...

    def endpoint(self, model: TrainableModel) -> InferenceEndpoint:
        """Where rollouts reach the model's served adapter."""
        ...

    def base_model(self) -> Model:
        """The untrained base model on the same server (a baseline, or a judge that is not the policy)."""
        ...

    async def close(self) -> None:
        """Stop serving and release the run (its lock, servers, W&B run)."""
        ...


@runtime_checkable
class OpensSessions(Protocol):
    """A backend that can open rollout sessions on its gateway (`model.session()`): LocalBackend and
    RemoteBackend; optional for other backends."""

    async def open_session(self, model: TrainableModel) -> str:
        """Open a rollout session on the gateway: its id, the prefix /v1/sessions/{id}/ of its base URL."""
        ...

    async def close_session(
        self, model: TrainableModel, session_id: str
    ) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """Close a rollout session (later requests on it get 404) and return its exchanges, as chat
        completions (request body, answer), in the order they were answered."""
        ...


class TrainableModel(Model):
    """A model trained with LoRA by a backend, and served by it at its latest checkpoint."""

    base_model: str = "smollm2-135m-instruct"
    """The packaged default, a Hugging Face id, or a local folder."""
    base_path: str = DEFAULT_BASE_PATH
    """Root folder for runs: checkpoints, logs, metrics."""
    lora: LoRAConfig = Field(default_factory=LoRAConfig)
    """The adapter's shape."""
    server: ServerConfig = Field(default_factory=ServerConfig)
    """The inference server's settings."""
    wandb: bool | None = None
    """Send metrics to a W&B run (project = `project`, name = `name`); None: only when WANDB_API_KEY is set."""

    _backend: Backend | None = PrivateAttr(default=None)
    _step: int = PrivateAttr(default=0)
    _interrupted: bool = PrivateAttr(default=False)

    @field_validator("name", "project")
    @classmethod
    def _safe_for_a_folder_name(cls, value: str, info: ValidationInfo) -> str:
        # Both become folders under base_path, and the name is served as "{name}@{step}".
        return check_safe_name(value, str(info.field_name))

    @property
    def registered(self) -> bool:
        """Whether a backend serves and trains this model."""
        return self._backend is not None

    @property
    def backend(self) -> Backend:
        """The backend that serves and trains this model (an error before `register`)."""
        return self._require_backend()

    @property
    def run_dir(self) -> Path:
        """{base_path}/{project}/{name}: everything this model writes."""
        return self._run_folder.path

    @property
    def _run_folder(self) -> RunFolder:
        return RunFolder.of(self.project, self.name, self.base_path)

    @property
    def step(self) -> int:
        """The step of the adapter served now, as this model last heard (`await get_step()` asks the backend)."""
        return self._step

    @property
    def inference_name(self) -> str:
        """ "{name}@{step}": the adapter the server serves for the current step."""
        return served_name(self.name, self._step)

    def _endpoint(self) -> str | None:
        return self._require_backend().endpoint(self).base_url

    def _make_client(self) -> openai.AsyncOpenAI:
        """A client at the backend's gateway, whose completions always carry sampled token ids and logprobs."""
        return endpoint_client(self._require_backend().endpoint(self), timeout_s=self.server.request_timeout_s)

    def litellm_params(self) -> dict[str, Any]:
        endpoint = self._require_backend().endpoint(self)
        return {
            "model": f"hosted_vllm/{self.inference_name}",
            "api_base": endpoint.base_url,
            "api_key": endpoint.api_key,
        }

    async def register(self, backend: Backend) -> None:
        """Attach a backend: it resumes from the latest checkpoint (or creates step 0) and serves it."""
        self._step = await backend.register(self)
        self._backend = backend
        void_after(self._run_folder.scenarios, self._step)  # steps after the one resumed never committed

    async def get_step(self) -> int:
        """The step of the latest complete checkpoint (0 before any training)."""
        self._step = await self._require_backend().get_step(self)
        return self._step

    async def train(
        self,
        groups: list[TrajectoryGroup],
        config: TrainConfig | None = None,
        *,
        step_metrics: dict[str, float] | None = None,
        dropped: Sequence[TrajectoryGroup] = (),
    ) -> TrainResult:
        """One GRPO step on these groups; the server then serves the new checkpoint.

        `step_metrics`: numbers about this step measured outside the backend (a pipelined loop's
        staleness and idle time), recorded with the step's own in metrics.jsonl. `dropped`: groups this
        step consumed without training them (a pipelined loop's stale ones, or ones `after_each` dropped);
        the sampled tokens of those it gathered are the ledger's `tokens_discarded_stale`. The scenarios of
        both (`DatasetBatch.groups` names them) go to the run's record, see `trained_scenarios`."""
        backend, record = self._require_backend(), self._run_folder.scenarios
        if self._interrupted:  # an earlier call was cancelled: whether its step committed is the backend's to say
            self._step = await backend.get_step(self)
            void_after(record, self._step)
            self._interrupted = False
        consumed = group_scenarios([*groups, *dropped])
        if consumed:
            record_step(record, self._step + 1, consumed)  # write-ahead: counts once checkpoint step+1 commits
        try:
            # A group dropped before its gather (by `after_each`) sampled nothing the backend could count.
            sampled = [group for group in dropped if not group.pending]
            result = await backend.train(
                self, groups, config or TrainConfig(), step_metrics=step_metrics, dropped=sampled
            )
        except Exception:
            if consumed:  # a backend that raises has rolled the step back: its write-ahead line never counts
                void_after(record, self._step)
            raise
        except BaseException:
            self._interrupted = True
            raise
        self._step = result.step
        if consumed and result.skipped:
            void_after(record, result.step)
            record_step(record, result.step, consumed)
        return result

    def trained_scenarios(self) -> dict[str, list[int]]:
        """Each scenario key ("{epoch}:{id}") a committed step of this run consumed, with that step: pass
        its keys to `iterate_dataset(already_trained=...)` to resume without repeating or skipping one.
        Registered first: which step is committed is the backend's to say."""
        self._require_backend()
        return trained_scenarios(self._run_folder.scenarios, self._step)

    async def train_sft(self, demonstrations: list[History], config: SFTConfig | None = None) -> TrainResult:
        """Supervised LoRA training on demonstrations (a warm start); checkpointed and served like a step."""
        result = await self._require_backend().train_sft(self, list(demonstrations), config or SFTConfig())
        self._step = result.step
        return result

    def session(self) -> contextlib.AbstractAsyncContextManager[RolloutSession]:
        """A base URL for one rollout (`async with model.session() as session:`): point an agent program
        at `session.base_url` (key `session.api_key`, model `session.model`); its completions become
        `session.trajectory` when the block ends. See `agentrl.client.rollout_session`."""
        from agentrl.client.rollout_session import rollout_session

        backend = self._require_backend()
        if not isinstance(backend, OpensSessions):
            raise ConfigurationError(
                f"{type(backend).__name__} cannot open rollout sessions (it has no open_session/close_session); "
                "use a LocalBackend or a RemoteBackend, or capture_trajectory() around a client in this process"
            )
        opened = functools.partial(backend.open_session, self)
        closed = functools.partial(backend.close_session, self)
        return rollout_session(backend.endpoint(self), self.inference_name, opened, closed)

    async def log(
        self, trajectories_or_groups: list[Trajectory] | list[TrajectoryGroup], split: str = "val"
    ) -> dict[str, float]:
        """Record evaluation results at the current step, beside the training metrics (metrics.jsonl,
        trajectories, an HTML transcript, reward.png); returns the averaged metrics."""
        check_safe_name(split, "split")  # it names files in the run folder
        items: list[Trajectory | TrajectoryGroup] = list(trajectories_or_groups)
        groups = [g if isinstance(g, TrajectoryGroup) else TrajectoryGroup([g]) for g in items]
        return await self._require_backend().log(self, groups, split)

    async def delete_checkpoints(self, *, keep_last: int = 1, best_by: str | None = DEFAULT_BEST_BY) -> list[int]:
        """Delete old checkpoints, keeping the last `keep_last` and the best by `best_by` ("split/metric"
        from metrics.jsonl; by default the best held-out reward, as ART keeps); returns deleted steps."""
        return await self._require_backend().delete_checkpoints(self, keep_last=keep_last, best_by=best_by)

    def _require_backend(self) -> Backend:
        if self._backend is None:
            raise AgentRLError(
                f"model {self.name!r} has no backend yet; call `await model.register(agentrl.LocalBackend())` first"
            )
        return self._backend
