"""Bad input and injected faults, as a new user meets them: each gets a clear error or is handled.

The table holds one real call per case (real trainer, real vLLM server on loopback, real files,
real processes and sockets) with the error type it must raise and a fragment of its message.
Cases that end without raising (a skipped step, a tool's error text, a torn line skipped) raise
`Handled` with what the user is told, so every row is checked the same way. With
AGENTRL_BAD_INPUT_TABLE=path, each row's actual error is appended there (the closing note's table).
What a failed step leaves behind is checked in test_step_faults.py.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pydantic
import pytest

import agentrl
from agentrl.backend.processes import free_port
from agentrl.backend.serving.server import VLLMServer
from agentrl.client.http_client import endpoint_client
from agentrl.foundation.config import ServerConfig
from agentrl.foundation.endpoint import InferenceEndpoint
from agentrl.records.checkpoints import CheckpointStore
from agentrl.records.tracking import append_metrics, read_metrics
from agentrl.rl.engine_context import tokenize_groups
from agentrl_environments.email_agent.tools import execute
from tests.helpers import make_choice

ROOT = Path(__file__).resolve().parents[2]
NAN, INF = math.nan, math.inf


class Handled(Exception):  # noqa: N818 - an outcome, not a failure
    """The case ended without an exception reaching the user; the message is what they are told."""


@dataclass
class Ctx:
    tmp_path: Path
    request: pytest.FixtureRequest
    served_model: agentrl.TrainableModel | None = None

    @property
    def model(self) -> agentrl.TrainableModel:
        assert self.served_model is not None, "a server case must be in SERVER_CASES"
        return self.served_model

    @property
    def tokenizer(self):
        return self.request.getfixturevalue("tokenizer")


@dataclass(frozen=True)
class Case:
    name: str
    call: Callable[[Ctx], Any]
    error: type[BaseException]
    fragment: str


# --- helpers that make one real call each ---


def assign_reward(value: Any) -> Callable[[Ctx], Any]:
    def call(ctx: Ctx) -> None:
        trajectory = agentrl.Trajectory(messages_and_choices=[{"role": "user", "content": "hi"}])
        trajectory.reward = value

    return call


async def gather_with_bypassed_reward(ctx: Ctx) -> None:
    async def rollout(reward: float) -> agentrl.Trajectory:
        trajectory = agentrl.Trajectory(messages_and_choices=[{"role": "user", "content": "hi"}])
        trajectory.__dict__["reward"] = reward  # skips pydantic's assignment check, as a careless copy can
        return trajectory

    await agentrl.gather_trajectory_groups([agentrl.TrajectoryGroup([rollout(1.0), rollout(NAN)])], show_progress=False)


def gather_with(**budget: Any) -> Callable[[Ctx], Any]:
    async def call(ctx: Ctx) -> None:
        async def rollout() -> agentrl.Trajectory:
            return agentrl.Trajectory()

        await agentrl.gather_trajectory_groups([agentrl.TrajectoryGroup([rollout()])], show_progress=False, **budget)

    return call


async def gather_a_rollout_returning_none(ctx: Ctx) -> None:
    async def rollout() -> None:
        return None

    await agentrl.gather_trajectory_groups([agentrl.TrajectoryGroup([rollout()])], show_progress=False)


def build(cls: type, **fields: Any) -> Callable[[Ctx], Any]:
    return lambda ctx: cls(**fields)


def train_config(**fields: Any) -> Callable[[Ctx], Any]:
    return build(agentrl.TrainConfig, **fields)


def model_repr_hides_the_key(ctx: Ctx) -> None:
    model = agentrl.Model(name="judge", api_key="sk-very-secret")
    shown = f"{model!r} {model} {model.model_dump()}"
    assert "sk-very-secret" not in shown
    assert model.litellm_params()["api_key"] == "sk-very-secret"  # still usable
    raise Handled(repr(model))


def tool(name: str, arguments: str) -> Callable[[Ctx], Any]:
    def call(ctx: Ctx) -> None:
        world = ctx.request.getfixturevalue("email_world")
        from agentrl_environments.email_agent.mailbox import Mailbox

        box = Mailbox(world.database, world.data.inboxes[0])
        try:
            outcome = execute(box, name, arguments)
        finally:
            box.close()
        assert outcome.malformed
        raise Handled(outcome.content)

    return call


def metrics_with_a_torn_last_line(ctx: Ctx) -> None:
    run = ctx.tmp_path / "run"
    append_metrics(run, {"step": 1, "split": "train", "reward_mean": 0.5})
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 2, "split": "tr')  # a disk that filled up mid-line, before this version
    assert [r["step"] for r in read_metrics(run)] == [1]
    append_metrics(run, {"step": 2, "split": "train", "reward_mean": 0.75})
    assert [r["step"] for r in read_metrics(run)] == [1, 2]
    raise Handled("torn line skipped with a warning; later lines read")


def metrics_with_nan(ctx: Ctx) -> None:
    run = ctx.tmp_path / "run"
    append_metrics(run, {"step": 1, "split": "train", "kl": NAN, "loss": INF})
    text = (run / "metrics.jsonl").read_text()
    assert "NaN" not in text and "Infinity" not in text and json.loads(text)["kl"] is None
    raise Handled(text.strip())


def checkpoint_info(content: str) -> Callable[[Ctx], Any]:
    def call(ctx: Ctx) -> None:
        store = CheckpointStore(ctx.tmp_path)
        store.save(3, lambda folder: None, {"metrics": {}})
        (store.path(3) / "agentrl-checkpoint.json").write_text(content)
        store.info(3)

    return call


def delete_keeping_none(ctx: Ctx) -> None:
    CheckpointStore(ctx.tmp_path).delete(keep_last=0)


LOCK_HOLDER = """
import sys, time
from agentrl.backend.run_lock import RunLock
RunLock(sys.argv[1]).acquire()
print("locked", flush=True)
time.sleep(120)
"""


async def register_while_another_process_holds_the_run(ctx: Ctx) -> None:
    model = agentrl.TrainableModel(name="locked", project="p", base_path=str(ctx.tmp_path))
    holder = subprocess.Popen(
        [sys.executable, "-c", LOCK_HOLDER, str(model.run_dir)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        start_new_session=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        try:
            await model.register(agentrl.LocalBackend())
        except agentrl.RunLockedError as error:
            assert str(holder.pid) in str(error)
            assert not (model.run_dir / "checkpoints").exists()  # nothing was touched
            raise
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()


async def register_a_second_backend_on_the_session_run(ctx: Ctx) -> None:
    served = ctx.model
    twin = agentrl.TrainableModel(name=served.name, project=served.project, base_path=served.base_path)
    await twin.register(agentrl.LocalBackend())


def stand_in_server(ctx: Ctx, command: list[str]) -> VLLMServer:
    """A VLLMServer handle whose process is `command` (its output as the log), at a port nothing serves."""
    server = VLLMServer("/m", ctx.tmp_path / "vllm.log", ServerConfig(), max_lora_rank=8)
    server.port = free_port()
    with open(server.log_path, "wb") as log:
        server.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return server


async def ask(server: VLLMServer, timeout_s: float) -> None:
    endpoint = InferenceEndpoint(
        server.base_url, server.api_key, death_notice=server.death_notice, recent_log=server.recent_log
    )
    client = endpoint_client(endpoint, timeout_s=timeout_s)
    try:
        await client.chat.completions.create(model="m@0", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    finally:
        await client.close()


async def rollout_against_a_dead_server(ctx: Ctx) -> None:
    crash = "print('EngineCore failed: CUDA out of memory (stand-in)'); raise SystemExit(3)"
    server = stand_in_server(ctx, [sys.executable, "-c", crash])
    server.process.wait()
    started = time.monotonic()
    try:
        await ask(server, timeout_s=30)
    except openai.InternalServerError as error:
        assert time.monotonic() - started < 10  # no retries against a dead server
        assert str(server.log_path) in str(error) and "EngineCore failed" in str(error)  # path and tail
        raise


async def rollout_against_a_hung_server(ctx: Ctx) -> None:
    server = stand_in_server(ctx, ["sh", "-c", "echo 'Engine 000: Running: 3 reqs, Waiting: 5 reqs'; sleep 60"])
    listener = socket.socket()
    listener.bind(("127.0.0.1", server.port))
    listener.listen(8)  # connections are accepted by the kernel, and never answered
    started = time.monotonic()
    try:
        await ask(server, timeout_s=1)
    except openai.InternalServerError as error:
        assert "Running: 3 reqs, Waiting: 5 reqs" in str(error)  # what the server was doing, from its log
        raise
    finally:
        assert time.monotonic() - started < 10  # one timeout, no retries
        listener.close()
        os.killpg(server.process.pid, signal.SIGKILL)
        server.process.wait()


def tokenize_a_choice_without_token_data(ctx: Ctx) -> None:
    choice = make_choice([1, 2, 3])
    choice.logprobs = None
    choice.token_ids = None
    trajectory = agentrl.Trajectory(messages_and_choices=[{"role": "user", "content": "hi"}, choice], reward=1.0)
    tokenize_groups([agentrl.TrajectoryGroup([trajectory])], [[1.0]], ctx.tokenizer)


async def ruler_with_an_unreachable_judge(ctx: Ctx) -> None:
    judge = agentrl.Model(name="judge", base_url=f"http://127.0.0.1:{free_port()}/v1", api_key="k")
    group = agentrl.TrajectoryGroup(
        agentrl.Trajectory(messages_and_choices=[{"role": "user", "content": "q"}, {"role": "assistant", "content": a}])
        for a in ("yes", "no")
    )
    await agentrl.ruler_score_group(group, judge, max_attempts=1)


# --- training calls on the session's real model ---


def sampled(reward: float, content: str = "42") -> agentrl.Trajectory:
    """A trajectory with one sampled turn (token ids and logprobs as vLLM returns them)."""
    choice = make_choice([19, 20, 2], content=content)
    return agentrl.Trajectory(messages_and_choices=[{"role": "user", "content": "Which?"}, choice], reward=reward)


def train_on(make_groups: Callable[[], list[agentrl.TrajectoryGroup]]) -> Callable[[Ctx], Any]:
    async def call(ctx: Ctx) -> None:
        model = ctx.model
        step = await model.get_step()
        result = await model.train(make_groups(), agentrl.TrainConfig())
        assert result.skipped and result.step == step == await model.get_step()
        raise Handled(f"skipped: {result.skip_reason}")

    return call


def never_gathered() -> list[agentrl.TrajectoryGroup]:
    async def rollout() -> agentrl.Trajectory:
        return sampled(1.0)

    pending = [rollout(), rollout()]
    group = agentrl.TrajectoryGroup(pending)
    for coroutine in pending:  # the test's own tidy-up: they were never meant to run
        coroutine.close()
    return [group]


def failure(error: Exception) -> agentrl.RolloutException:
    return agentrl.RolloutException.from_exception(error)


def judge_failed(n: int) -> list[agentrl.TrajectoryGroup]:
    error = agentrl.JudgeError("judge openai/no-such-model gave no valid answer in 3 attempt(s): NotFoundError: 404")
    return [agentrl.TrajectoryGroup([], exceptions=[failure(error)]) for _ in range(n)]


def bypassed_reward_group() -> list[agentrl.TrajectoryGroup]:
    group = agentrl.TrajectoryGroup([sampled(1.0), sampled(0.0)])
    group.trajectories[1].__dict__["reward"] = INF
    return [group]


async def train_expecting(ctx: Ctx, groups: list[agentrl.TrajectoryGroup]) -> None:
    await ctx.model.train(groups, agentrl.TrainConfig())


CASES = [
    Case(
        "reward = NaN assigned in a rollout",
        assign_reward(NAN),
        pydantic.ValidationError,
        "reward must be a finite number, got nan",
    ),
    Case("reward = None assigned", assign_reward(None), pydantic.ValidationError, "got None"),
    Case(
        "reward = '0.5' (text) assigned", assign_reward("0.5"), pydantic.ValidationError, "set `traj.reward` to a float"
    ),
    Case("reward = inf assigned", assign_reward(INF), pydantic.ValidationError, "got inf"),
    Case(
        "NaN reward bypassing validation, gathered",
        gather_with_bypassed_reward,
        agentrl.RolloutError,
        "RewardError: group 0, rollout 1 has reward nan",
    ),
    Case(
        "rollout returns None",
        gather_a_rollout_returning_none,
        agentrl.RolloutError,
        "must return an agentrl.Trajectory",
    ),
    Case(
        "max_exceptions=0.1 (ART's fraction)",
        gather_with(max_exceptions=0.1),
        agentrl.ConfigurationError,
        "use max_exception_rate=0.1",
    ),
    Case(
        "max_exception_rate=1.5", gather_with(max_exception_rate=1.5), agentrl.ConfigurationError, "fraction in [0, 1]"
    ),
    Case("max_exceptions=-1", gather_with(max_exceptions=-1), agentrl.ConfigurationError, "int >= 0"),
    Case("PPO clip_low=-5", train_config(loss={"name": "ppo", "clip_low": -5}), pydantic.ValidationError, "clip_low"),
    Case("PPO clip_high=0", train_config(loss={"name": "ppo", "clip_high": 0}), pydantic.ValidationError, "clip_high"),
    Case("GSPO clip_low=2", train_config(loss={"name": "gspo", "clip_low": 2}), pydantic.ValidationError, "clip_low"),
    Case(
        "CISPO clip_high=NaN",
        train_config(loss={"name": "cispo", "clip_high": NAN}),
        pydantic.ValidationError,
        "finite number",
    ),
    Case("DRO beta=-3", train_config(loss={"name": "dro", "beta": -3}), pydantic.ValidationError, "beta"),
    Case("kl_coef=inf", train_config(kl_coef=INF), pydantic.ValidationError, "kl_coef"),
    Case("learning_rate=inf", train_config(learning_rate=INF), pydantic.ValidationError, "learning_rate"),
    Case("learning_rate=NaN", train_config(learning_rate=NAN), pydantic.ValidationError, "learning_rate"),
    Case("max_grad_norm=-1", train_config(max_grad_norm=-1), pydantic.ValidationError, "max_grad_norm"),
    Case("weight_decay=inf", train_config(weight_decay=INF), pydantic.ValidationError, "weight_decay"),
    Case(
        "truncated_importance_sampling=NaN",
        train_config(truncated_importance_sampling=NAN),
        pydantic.ValidationError,
        "truncated_importance_sampling",
    ),
    Case(
        "max_judge_failure_rate=2",
        train_config(max_judge_failure_rate=2),
        pydantic.ValidationError,
        "max_judge_failure_rate",
    ),
    Case(
        "SFT learning_rate=inf", build(agentrl.SFTConfig, learning_rate=INF), pydantic.ValidationError, "learning_rate"
    ),
    Case(
        "ServerConfig request_timeout_s=0",
        build(agentrl.ServerConfig, request_timeout_s=0),
        pydantic.ValidationError,
        "request_timeout_s",
    ),
    Case(
        "name='../../x'",
        build(agentrl.TrainableModel, name="../../x"),
        pydantic.ValidationError,
        "name '../../x' must be",
    ),
    Case(
        "project='a/b'",
        build(agentrl.TrainableModel, name="a", project="a/b"),
        pydantic.ValidationError,
        "project 'a/b' must be",
    ),
    Case("name='a@b'", build(agentrl.TrainableModel, name="a@b"), pydantic.ValidationError, "without '..', '/' or '@'"),
    Case("name='..'", build(agentrl.TrainableModel, name=".."), pydantic.ValidationError, "name '..' must be"),
    Case("api_key in a repr", model_repr_hides_the_key, Handled, "api_key=SecretStr('**********')"),
    Case(
        "tool: keywords is an object",
        tool("search_emails", '{"keywords": {"a": 1}}'),
        Handled,
        "argument 'keywords' must be a JSON string",
    ),
    Case(
        "tool: max_results=1e999",
        tool("search_emails", '{"keywords": "x", "max_results": 1e999}'),
        Handled,
        "'max_results' must be a JSON integer",
    ),
    Case("tool: nesting 100,000 deep", tool("read_email", "[" * 100_000), Handled, "not valid JSON"),
    Case(
        "tool: 5,000-digit number",
        tool("search_emails", '{"keywords": "x", "max_results": ' + "9" * 5000 + "}"),
        Handled,
        "not valid JSON",
    ),
    Case("tool: arguments are a list", tool("read_email", "[1, 2]"), Handled, "must be a JSON object"),
    Case(
        "tool: sources is a number",
        tool("return_final_answer", '{"answer": "x", "sources": [{"id": 1}]}'),
        Handled,
        "'sources[0]' must be a JSON string",
    ),
    Case("metrics.jsonl torn last line", metrics_with_a_torn_last_line, Handled, "torn line skipped"),
    Case("NaN metric", metrics_with_nan, Handled, '"kl": null'),
    Case("empty checkpoint info file", checkpoint_info(""), agentrl.CheckpointError, "not valid JSON (empty or torn)"),
    Case(
        "checkpoint info of another step",
        checkpoint_info('{"step": 7}'),
        agentrl.CheckpointError,
        "does not record step 3",
    ),
    Case("delete_checkpoints(keep_last=0)", delete_keeping_none, agentrl.ConfigurationError, "keep_last must be >= 1"),
    Case(
        "second process registers a locked run",
        register_while_another_process_holds_the_run,
        agentrl.RunLockedError,
        "is in use by process",
    ),
    Case(
        "rollout against a dead server", rollout_against_a_dead_server, openai.InternalServerError, "exited with code 3"
    ),
    Case(
        "rollout against a hung server",
        rollout_against_a_hung_server,
        openai.InternalServerError,
        "gave no answer within 1 s",
    ),
    Case(
        "Choice without token data",
        tokenize_a_choice_without_token_data,
        agentrl.TokenizationError,
        "group 0, trajectory 0",
    ),
    Case(
        "RULER with an unreachable judge",
        ruler_with_an_unreachable_judge,
        agentrl.JudgeError,
        "judge openai/judge gave no valid answer",
    ),
]
SERVER_CASES = [  # calls on the session's real model (vLLM + trainer)
    Case("train([])", train_on(list), Handled, "no groups were given"),
    Case("train(groups never gathered)", train_on(never_gathered), Handled, "never gathered"),
    Case(
        "train(all rollouts failed)",
        train_on(lambda: [agentrl.TrajectoryGroup([], exceptions=[failure(TimeoutError("x"))])]),
        Handled,
        "every rollout failed",
    ),
    Case(
        "train(no sampled turn)",
        train_on(
            lambda: [
                agentrl.TrajectoryGroup(
                    [
                        agentrl.Trajectory(
                            messages_and_choices=[
                                {"role": "user", "content": "q"},
                                {"role": "assistant", "content": "a"},
                            ],
                            reward=r,
                        )
                        for r in (0.0, 1.0)
                    ]
                )
            ]
        ),
        Handled,
        "no sampled assistant turn",
    ),
    Case(
        "train(all rewards equal)",
        train_on(lambda: [agentrl.TrajectoryGroup([sampled(0.5), sampled(0.5)])]),
        Handled,
        "had all rewards equal",
    ),
    Case(
        "train(judge failed on every group)",
        lambda ctx: train_expecting(ctx, judge_failed(2)),
        agentrl.JudgeError,
        "judge failures dropped 2 of 2 groups",
    ),
    Case(
        "train(inf reward bypassing validation)",
        lambda ctx: train_expecting(ctx, bypassed_reward_group()),
        agentrl.RewardError,
        "group 0, trajectory 1 has reward inf",
    ),
    Case(
        "second backend on a run this process holds",
        register_a_second_backend_on_the_session_run,
        agentrl.RunLockedError,
        f"in use by process {os.getpid()}",
    ),
]


@pytest.fixture(scope="module")
def email_world():
    from agentrl_environments.email_agent.env import EmailEnvironment

    return EmailEnvironment.load()


async def check(case: Case, ctx: Ctx) -> None:
    with pytest.raises(case.error) as info:
        outcome = case.call(ctx)
        if asyncio.iscoroutine(outcome):
            await outcome
    message = str(info.value)
    assert case.fragment in message, message
    if table := os.environ.get("AGENTRL_BAD_INPUT_TABLE"):
        first = " ".join(message.split())[:230].replace("|", "/")
        with open(table, "a") as f:
            f.write(f"| {case.name} | {type(info.value).__name__} | {first} |\n")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_bad_input_gets_a_clear_error(case: Case, tmp_path: Path, request: pytest.FixtureRequest):
    await check(case, Ctx(tmp_path, request))


@pytest.mark.parametrize("case", SERVER_CASES, ids=[c.name for c in SERVER_CASES])
async def test_bad_input_on_the_real_server_gets_a_clear_error(case: Case, tmp_path: Path, request, served_model):
    await check(case, Ctx(tmp_path, request, served_model))
