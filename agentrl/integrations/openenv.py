"""OpenEnv environments as agentrl rollouts: `reset` gives the scenario, the model's replies become
`step` actions, the environment's rewards become the trajectory's reward. Needs the `openenv` extra.

Two ways an environment takes actions: text (each reply becomes an action through `action`, by
default `{"message": reply}`), or MCP tools (`use_tools=True`: the environment's tools, from its
MCPEnvironment, are offered to the model and each tool call is one `CallToolAction` step). The
environment's server is the user's (any URL) or one started here with `serve_openenv`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, cast

import httpx
import openai

from agentrl.backend.processes import free_port
from agentrl.client.model import Model
from agentrl.data.trajectory import Trajectory
from agentrl.foundation.distribution import install_extra
from agentrl.foundation.errors import ConfigurationError, ServerError
from agentrl.mcp.servers import openai_tool

try:
    from openenv.core import GenericEnvClient, MCPToolClient
    from openenv.core.client_types import StepResult
    from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation, ListToolsObservation
    from websockets.exceptions import ConnectionClosed
except ImportError as error:  # pragma: no cover - the extra is missing
    raise ImportError(f"agentrl.integrations.openenv needs OpenEnv: {install_extra('openenv')}") from error

TEXT_KEYS = ("prompt", "message", "text", "question", "instruction", "echoed_message")
HIDDEN_KEYS = {"done", "reward", "metadata"}


def default_action(reply: str) -> dict[str, Any]:
    """The model's reply as an action of the common `{"message": ...}` shape."""
    return {"message": reply}


def default_observation_text(observation: Any) -> str:
    """An observation as the model reads it: its first text field, else its fields as JSON."""
    fields = observation if isinstance(observation, dict) else getattr(observation, "model_dump", lambda: {})()
    for key in TEXT_KEYS:
        if isinstance(fields.get(key), str) and fields[key]:
            return str(fields[key])
    shown = {k: v for k, v in fields.items() if k not in HIDDEN_KEYS}
    return json.dumps(shown, default=str)


class _EpisodeClient:
    """What agentrl adds to OpenEnv's clients (mixed in before them): a session the server ends (at its
    `max_concurrent_envs`, or on an error of its own) raises `ServerError` with the server's own reason, which
    arrives before the close and would otherwise be lost behind a bare close code; and a disconnect that lets the
    server close first, so its end of the episode does not log a `WebSocketDisconnect` traceback."""

    _ws: Any
    _ws_url: str

    async def _send_and_receive(self, message: dict[str, Any]) -> dict[str, Any]:
        try:
            await self._send(message)  # type: ignore[attr-defined]
            reply: dict[str, Any] = await self._receive()  # type: ignore[attr-defined]
        except ConnectionClosed as closed:
            pending: Any = None  # the reason the server sent before it closed, still in the connection's buffer
            with contextlib.suppress(Exception):
                pending = json.loads(await asyncio.wait_for(self._ws.recv(), CLOSING_S))
            if not (isinstance(pending, dict) and pending.get("type") == "error"):
                raise ServerError(
                    f"the OpenEnv environment at {self._ws_url} closed the session ({closed})"
                ) from closed
            reply = pending
        if reply.get("type") == "error":
            data = reply.get("data") or {}
            if data.get("code") == "CAPACITY_REACHED":
                raise ServerError(
                    f"the OpenEnv environment at {self._ws_url} is at capacity ({data.get('message')}): raise its "
                    "max_concurrent_envs (create_app(..., max_concurrent_envs=N)) or run fewer rollouts at once"
                )
            raise ServerError(
                f"the OpenEnv environment at {self._ws_url} answered: {data.get('message')} ({data.get('code')})"
            )
        return reply

    async def disconnect(self) -> None:
        ws = self._ws
        if ws is not None:  # ask the server to end the session and wait until it has closed its end
            with contextlib.suppress(Exception):
                await ws.send(json.dumps({"type": "close"}))
                await asyncio.wait_for(ws.wait_closed(), CLOSING_S)
        await super().disconnect()  # type: ignore[misc]


CLOSING_S = 5.0
"""How long a closing session waits for the server's side (and for the reason it closed, when it did)."""


class _TextEnvClient(_EpisodeClient, GenericEnvClient):  # type: ignore[misc]  # openenv ships no type information
    """OpenEnv's generic client with `_EpisodeClient`'s closing."""


class _ToolEnvClient(_EpisodeClient, MCPToolClient):  # type: ignore[misc]  # openenv ships no type information
    """OpenEnv's MCP client, keeping the fields of observations that are not tool results (the
    reset's prompt), which its parser drops."""

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[Any]:
        result = super()._parse_result(payload)
        if not isinstance(result.observation, (CallToolObservation, ListToolsObservation)):
            result.observation = payload.get("observation", {})
        return result


def _tool_result_text(observation: Any) -> tuple[str, bool]:
    error = getattr(observation, "error", None) or (observation.get("error") if isinstance(observation, dict) else None)
    if error:
        message = getattr(error, "message", None) or (error.get("message") if isinstance(error, dict) else str(error))
        return f"Error: {message}", True
    result = getattr(observation, "result", None) if not isinstance(observation, dict) else observation.get("result")
    if isinstance(result, dict) and "data" in result:
        result = result["data"]
    if isinstance(result, dict) and isinstance(result.get("content"), list):
        texts = [c.get("text", "") for c in result["content"] if isinstance(c, dict)]
        return "\n".join(texts), bool(result.get("is_error") or result.get("isError"))
    return (result if isinstance(result, str) else json.dumps(result, default=str)), False


async def openenv_rollout(  # noqa: C901 - over the limit when the rule came on; split it when next changed
    model: Model,
    base_url: str,
    *,
    system_prompt: str | None = None,
    max_turns: int = 8,
    max_tokens: int = 256,
    temperature: float = 1.0,
    use_tools: bool = False,
    action: Callable[[str], Any] = default_action,
    observation_text: Callable[[Any], str] = default_observation_text,
    reset_kwargs: dict[str, Any] | None = None,
) -> Trajectory:
    """One episode of the OpenEnv environment at `base_url`, played by `model`; reward = the sum of
    the step rewards. Each episode has its own session (WebSocket) on the server, closed on every path."""
    if max_turns < 1:
        raise ConfigurationError(f"max_turns must be at least 1, got {max_turns}")
    client_class = _ToolEnvClient if use_tools else _TextEnvClient
    env = client_class(base_url=base_url)
    try:
        await env.connect()
    except Exception as error:  # noqa: BLE001  any failure to connect names the URL
        raise ServerError(
            f"could not connect to the OpenEnv environment at {base_url}: {type(error).__name__}: {error}. "
            "Start its server (uvicorn module:app, or agentrl.integrations.openenv.serve_openenv) and pass its URL"
        ) from error
    try:
        result = await env.reset(**(reset_kwargs or {}))
        tools: list[dict[str, Any]] | None = None
        if use_tools:
            listed = await env.list_tools()
            tools = [openai_tool(t.name, t.description, t.input_schema) for t in listed]
        messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt}] if system_prompt else []
        messages.append({"role": "user", "content": observation_text(result.observation)})
        trajectory = Trajectory(messages_and_choices=messages, tools=tools)
        client = model.openai_client()
        total_reward, turns, steps, tool_errors = 0.0, 0, 0, 0
        done = bool(result.done)
        while not done and turns < max_turns:
            turns += 1
            completion = await client.chat.completions.create(
                model=model.inference_name,
                messages=cast(Any, trajectory.messages()),
                tools=cast(Any, tools) if tools else openai.omit,
                max_tokens=max_tokens,
                temperature=temperature,
            )
            choice = completion.choices[0]
            trajectory.messages_and_choices.append(choice)
            calls = [c for c in choice.message.tool_calls or [] if c.type == "function"]
            if use_tools and not calls:
                break  # an answer without a tool call ends the episode: no action to take
            if not use_tools:
                result = await env.step(action(choice.message.content or ""))
                steps += 1
                total_reward += float(result.reward or 0.0)
                done = bool(result.done)
                if not done:
                    trajectory.messages_and_choices.append(
                        {"role": "user", "content": observation_text(result.observation)}
                    )
                continue
            for call in calls:
                try:
                    arguments = json.loads(call.function.arguments or "{}")
                except ValueError:
                    arguments = None
                if not isinstance(arguments, dict):
                    content, is_error = f"Error: the arguments are not a JSON object: {call.function.arguments!r}", True
                else:
                    result = await env.step(CallToolAction(tool_name=call.function.name, arguments=arguments))
                    steps += 1
                    total_reward += float(result.reward or 0.0)
                    done = done or bool(result.done)
                    content, is_error = _tool_result_text(result.observation)
                tool_errors += is_error
                trajectory.messages_and_choices.append({"role": "tool", "tool_call_id": call.id, "content": content})
                if done:
                    break
        trajectory.reward = total_reward
        trajectory.metrics.update(turns=turns, env_steps=steps, episode_done=done, tool_errors=tool_errors)
        return trajectory
    finally:
        await env.close()


@asynccontextmanager
async def serve_openenv(app: str, *, cwd: str | None = None, startup_timeout_s: float = 60.0) -> AsyncIterator[str]:
    """Serve an OpenEnv app ("package.module:app", as uvicorn takes it) on loopback for the block;
    yields its base URL and stops the server (and its process) on the way out."""
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "uvicorn",
        app,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    process = subprocess.Popen(command, cwd=cwd)
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = asyncio.get_running_loop().time() + startup_timeout_s
        async with httpx.AsyncClient() as http:
            while True:
                if process.poll() is not None:
                    raise ServerError(
                        f"the OpenEnv app {app!r} exited with {process.returncode} before serving; see its log above"
                    )
                try:
                    if (await http.get(f"{base_url}/health", timeout=2.0)).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if asyncio.get_running_loop().time() > deadline:
                    raise ServerError(f"the OpenEnv app {app!r} did not answer /health within {startup_timeout_s:g} s")
                await asyncio.sleep(0.3)
        yield base_url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
