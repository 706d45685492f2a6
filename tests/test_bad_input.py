"""Bad input and injected faults, as a new user meets them: each gets a clear error or is handled.

The table holds one real call per case (real trainer, real vLLM server on loopback, real files,
real processes and sockets) with the error type it must raise and a fragment of its message.
Cases that end without raising (a skipped step, a tool's error text, a torn line skipped) raise
`Handled` with what the user is told, so every row is checked the same way. With
AGENTRL_BAD_INPUT_TABLE=path, each row's actual error is appended there (the closing note's table).
The tests after the table check state: that a failed step changed nothing, and what comes next.
"""

from __future__ import annotations

import asyncio
import copy
import functools
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
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import agentrl
from agentrl.backend.checkpoints import CheckpointStore
from agentrl.backend.protocol import InferenceEndpoint
from agentrl.backend.server import VLLMServer, free_port
from agentrl.config import ServerConfig
from agentrl.model import endpoint_client
from agentrl.rl.tokenize import tokenize_groups
from agentrl.tracking import append_metrics, read_metrics
from agentrl_environments.email_agent.tools import execute
from tests.helpers import make_choice

ROOT = Path(__file__).resolve().parent.parent
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
    endpoint = InferenceEndpoint(server.base_url, server.api_key, death_notice=server.death_notice)
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
    server = stand_in_server(ctx, ["sleep", "60"])
    listener = socket.socket()
    listener.bind(("127.0.0.1", server.port))
    listener.listen(8)  # connections are accepted by the kernel, and never answered
    started = time.monotonic()
    try:
        await ask(server, timeout_s=1)
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


def test_the_table_has_at_least_thirty_cases():
    cases = CASES + SERVER_CASES
    assert len(cases) >= 30 and len({c.name for c in cases}) == len(cases)


# --- state after a fault ---


def adapter_state(model: agentrl.TrainableModel) -> dict[str, torch.Tensor]:
    from peft import get_peft_model_state_dict

    adapter = model.backend.session(model).adapter
    weights = get_peft_model_state_dict(model.backend.trainer.model, adapter_name=adapter)
    return {k: v.detach().clone() for k, v in weights.items()}


def optimizer_state(model: agentrl.TrainableModel) -> dict:
    """AdamW's moments and step counts (lr and weight decay are set from the config at every step)."""
    return copy.deepcopy(optimizer(model).state_dict()["state"])


def optimizer(model: agentrl.TrainableModel) -> torch.optim.Optimizer:
    return model.backend.trainer.adapters[model.backend.session(model).adapter].optimizer


def assert_same_state(before: dict, after: dict) -> None:
    assert before.keys() == after.keys()
    for key in before:
        if isinstance(before[key], torch.Tensor):
            assert torch.equal(before[key], after[key]), key
        elif isinstance(before[key], dict):
            assert_same_state(before[key], after[key])
        else:
            assert before[key] == after[key], key


@pytest.fixture
async def real_groups(served_model) -> list[agentrl.TrajectoryGroup]:
    """Real rollouts on the session's server, with rewards alternating 0/1 so every group carries a signal."""
    from agentrl_environments.larger_number.task import rollout, scenarios

    groups = await agentrl.gather_trajectory_groups(
        [agentrl.TrajectoryGroup(rollout(served_model, s) for _ in range(4)) for s in scenarios("train", 4, seed=11)],
        show_progress=False,
    )
    return [
        agentrl.TrajectoryGroup([t.model_copy(update={"reward": float(i % 2)}) for i, t in enumerate(g.trajectories)])
        for g in groups
    ]


def poisoned(groups: list[agentrl.TrajectoryGroup]) -> list[agentrl.TrajectoryGroup]:
    """The same groups with one sampled logprob NaN, as a broken sampler might return it."""
    groups = [g.model_copy(deep=True) for g in groups]
    groups[0].trajectories[0].choices()[0].logprobs.content[0].logprob = NAN
    return groups


async def test_a_non_finite_step_changes_nothing_and_the_next_step_trains(served_model, real_groups):
    step = await served_model.get_step()
    weights, moments = adapter_state(served_model), optimizer_state(served_model)
    checkpoints = CheckpointStore(served_model.run_dir).steps()
    with pytest.raises(agentrl.TrainingError, match="loss is nan.*nothing was applied or saved"):
        await served_model.train(poisoned(real_groups), agentrl.TrainConfig(learning_rate=1e-3))
    assert await served_model.get_step() == step and CheckpointStore(served_model.run_dir).steps() == checkpoints
    assert_same_state(weights, adapter_state(served_model))
    assert_same_state(moments, optimizer_state(served_model))
    result = await served_model.train(real_groups, agentrl.TrainConfig(learning_rate=1e-3))
    assert result.step == step + 1 and not result.skipped and math.isfinite(result.metrics["grad_norm"])
    assert all(torch.isfinite(v).all() for v in adapter_state(served_model).values())


def full_disk_during_save(trainer_save):
    def save(adapter: str, folder: Path) -> None:
        trainer_save(adapter, folder)  # the files land, then the disk fills up on the last one
        raise OSError(28, "No space left on device")

    return save


async def test_a_failed_save_rolls_the_trainer_back_so_a_retry_applies_one_step(served_model, real_groups, monkeypatch):
    backend = served_model.backend
    step = await served_model.get_step()
    weights, moments = adapter_state(served_model), optimizer_state(served_model)
    monkeypatch.setattr(backend.trainer, "save", full_disk_during_save(backend.trainer.save))
    with pytest.raises(agentrl.CheckpointError, match="No space left on device.*rolled back"):
        await served_model.train(real_groups, agentrl.TrainConfig(learning_rate=1e-3))
    monkeypatch.undo()
    store = backend.session(served_model).store
    assert await served_model.get_step() == step and not list(store.root.glob(".staging-*"))
    assert_same_state(weights, adapter_state(served_model))
    assert_same_state(moments, optimizer_state(served_model))
    adam_steps = {float(s["step"]) for s in optimizer(served_model).state.values()}
    result = await served_model.train(real_groups, agentrl.TrainConfig(learning_rate=1e-3))
    assert result.step == step + 1  # exactly one step, not two
    assert {float(s["step"]) for s in optimizer(served_model).state.values()} == {s + 1 for s in adam_steps}


async def test_a_failed_switch_rolls_back_and_keeps_serving_the_old_adapter(served_model, real_groups, monkeypatch):
    backend = served_model.backend
    step = await served_model.get_step()
    weights = adapter_state(served_model)

    async def server_refuses(name: str, path: Path) -> None:
        raise agentrl.ServerError("POST /v1/load_lora_adapter failed with 500: stand-in for a dying server")

    monkeypatch.setattr(backend.server, "load_adapter", server_refuses)
    with pytest.raises(agentrl.ServerError, match="rolled back.*moved aside"):
        await served_model.train(real_groups, agentrl.TrainConfig(learning_rate=1e-3))
    monkeypatch.undo()
    store = backend.session(served_model).store
    assert await served_model.get_step() == step and store.steps()[-1] == step
    (aside,) = [p for p in store.root.glob(f".corrupt-{step + 1:04d}-*")]  # kept, not deleted
    assert "could not load checkpoint" in (aside / "WHY.txt").read_text()
    assert_same_state(weights, adapter_state(served_model))
    completion = await served_model.openai_client().chat.completions.create(
        model=served_model.inference_name, messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    assert completion.choices[0].message.content is not None
    assert (await served_model.train(real_groups, agentrl.TrainConfig(learning_rate=1e-3))).step == step + 1


async def test_judge_failures_on_30_percent_of_groups_train_and_are_reported(served_model, real_groups):
    dead_judge = agentrl.Model(name="judge", base_url=f"http://127.0.0.1:{free_port()}/v1", api_key="k")
    judged = [
        await agentrl.ruler_score_group(g, dead_judge, swallow_exceptions=True, max_attempts=1) for g in real_groups[:2]
    ]
    groups = [*judged, *real_groups, *real_groups[:1]]  # 2 of 7 groups (29%) lost to the judge
    step = await served_model.get_step()
    result = await served_model.train(groups, agentrl.TrainConfig(learning_rate=1e-3))
    assert result.step == step + 1 and not result.skipped
    assert result.metrics["num_groups_judge_failed"] == 2 and result.metrics["num_groups_given"] == 7
    assert "judge openai/judge gave no valid answer" in result.last_judge_error
    with pytest.raises(agentrl.JudgeError, match="dropped 2 of 3 groups"):  # over half: stop
        await served_model.train([*judged, real_groups[0]], agentrl.TrainConfig())


async def test_server_routes_need_the_backends_key(served_model):
    """vLLM's --api-key guards /v1 only; the guard closes every other route (GPU dev routes included)."""
    import httpx

    (server,) = served_model.backend.server.replicas
    root = f"http://127.0.0.1:{server.port}"
    key = {"Authorization": f"Bearer {server.api_key}"}
    async with httpx.AsyncClient(timeout=30) as client:
        assert (await client.get(f"{root}/health")).status_code == 200
        for method, path in [
            ("GET", "/v1/models"),
            ("GET", "/version"),
            ("POST", "/v1/load_lora_adapter"),
            ("POST", "/collective_rpc"),
            ("POST", "/sleep"),
            ("GET", "/metrics"),
        ]:
            for headers in ({}, {"Authorization": "Bearer wrong"}):
                response = await client.request(method, f"{root}{path}", headers=headers)
                assert response.status_code == 401, (path, headers, response.text)
        assert (await client.get(f"{root}/v1/models", headers=key)).status_code == 200
        assert (await client.get(f"{root}/version", headers=key)).status_code == 200


def test_corrupt_checkpoints_are_moved_aside_and_resume_takes_the_newest_valid(base_model_path, tmp_path, caplog):
    from agentrl.backend.adapter_files import OPTIMIZER_FILE
    from agentrl.backend.local import LocalBackend, ModelSession, _Engine
    from agentrl.backend.run_lock import RunLock
    from agentrl.backend.trainer import Trainer

    model = agentrl.TrainableModel(name="m", project="p", base_path=str(tmp_path))
    backend, trainer = LocalBackend(), Trainer(base_model_path)
    trainer.add_adapter("default", agentrl.LoRAConfig())
    backend._engine = _Engine(model.base_model, base_model_path, server=None, trainer=trainer, vocab_size=49152)  # type: ignore[arg-type]
    store = CheckpointStore(model.run_dir)
    session = ModelSession(model, "default", store, RunLock(model.run_dir))
    for step in range(5):
        store.save(step, functools.partial(trainer.save, "default"), {"metrics": {}})
    (store.path(4) / "adapter_model.safetensors").write_bytes(b"torn")  # a torn adapter
    (store.path(3) / OPTIMIZER_FILE).unlink()  # a lost optimizer file: never a silent reset
    (store.path(2) / "agentrl-checkpoint.json").write_text("")  # an empty info file
    assert backend._resume(session) == 1
    assert store.steps() == [0, 1]
    moved = sorted(p.name[:13] for p in store.root.glob(".corrupt-*"))
    assert moved == [".corrupt-0002", ".corrupt-0003", ".corrupt-0004"]  # kept for inspection
    assert "cannot read the adapter" in caplog.text and "cannot read the optimizer state" in caplog.text
    trainer.add_adapter("rank4", agentrl.LoRAConfig(rank=4))
    with pytest.raises(agentrl.CheckpointError, match="does not fit this model's LoRA"):
        trainer.load("rank4", store.path(1))


def test_delete_checkpoints_keeps_the_best_held_out_checkpoint_by_default(tmp_path):
    from agentrl.backend.local import LocalBackend, ModelSession
    from agentrl.backend.run_lock import RunLock
    from agentrl.tracking import record_step

    model = agentrl.TrainableModel(name="m", project="p", base_path=str(tmp_path))
    backend = LocalBackend()
    store = CheckpointStore(model.run_dir)
    for step in range(5):
        store.save(step, lambda folder: None, {"metrics": {}})
        record_step(model.run_dir, step, "val", [], {"reward_mean": [0.1, 0.2, 0.9, 0.3, 0.4][step]})
    backend.sessions[str(model.run_dir.resolve())] = ModelSession(model, "default", store, RunLock(model.run_dir), 4)
    model._backend = backend
    assert asyncio.run(model.delete_checkpoints()) == [0, 1, 3]  # ART's default: keep the best val and the latest
    assert store.steps() == [2, 4]
    with pytest.raises(agentrl.ConfigurationError, match="no checkpoint has a recorded 'val/nope'"):
        asyncio.run(model.delete_checkpoints(best_by="val/nope"))


def test_the_trainer_creates_every_tensor_on_the_models_device(base_model_path, monkeypatch):
    """No GPU here: the model and batches on `meta` show any tensor made on the CPU by mistake."""
    import torch.fx.experimental._config as fx_config
    import transformers.masking_utils

    from agentrl.backend.logprobs import token_logprobs
    from agentrl.backend.trainer import Trainer
    from agentrl.rl.tokenize import TokenizedSequence, collate

    trainer = Trainer(base_model_path, device="meta")
    trainer.add_adapter("default", agentrl.LoRAConfig())
    trainer.model.get_base_model().config._attn_implementation = "eager"  # sdpa's mask check reads values
    # and so does the check for packed rows in the position ids (the trainer's rows are never packed)
    monkeypatch.setattr(transformers.masking_utils, "find_packed_sequence_indices", lambda position_ids: None)
    sequences = [
        TokenizedSequence(
            [1, 2, 3, 4, 5, 6], [False, False, False, True, True, True], [0, 0, 0, -1.0, -0.5, -0.2], 1.0, 0
        ),
        TokenizedSequence([1, 2, 3, 4], [False, False, True, True], [0, 0, -1.0, -0.3], -1.0, 0),
    ]
    previous = fx_config.meta_nonzero_assume_all_nonzero
    fx_config.meta_nonzero_assume_all_nonzero = True  # boolean indexing on meta (data-dependent shape)
    try:
        logprobs_BT, entropy_N = token_logprobs(trainer.model, collate(sequences, trainer.pad_token_id).to("meta"))
        assert logprobs_BT.device.type == entropy_N.device.type == "meta"
        configs = [
            agentrl.TrainConfig(),
            agentrl.TrainConfig(kl_coef=0.1, loss="cispo", truncated_importance_sampling=2.0),
        ]
        for config in configs:
            sums, plan = trainer._accumulate_gradients(sequences, config, denominator=5.0)
            assert plan.packed  # the two share a prefix: the packed path's tensors are checked too
            assert {t.device.type for t in sums.values()} == {"meta"}
            assert all(
                p.grad is not None and p.grad.device.type == "meta" for p in trainer.adapters["default"].parameters
            )
    finally:
        fx_config.meta_nonzero_assume_all_nonzero = previous


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
ARGUMENTS = st.one_of(
    st.dictionaries(
        st.sampled_from(
            [
                "keywords",
                "from_addr",
                "to_addr",
                "sent_after",
                "sent_before",
                "max_results",
                "message_id",
                "answer",
                "sources",
                "other",
            ]
        ),
        JSON_VALUES,
        max_size=6,
    ).map(lambda d: json.dumps(d, allow_nan=True)),
    JSON_VALUES.map(lambda v: json.dumps(v, allow_nan=True)),
    st.integers(1, 50_000).map(lambda depth: "[" * depth + "]" * depth),
    st.integers(1, 6000).map(lambda digits: '{"keywords": "x", "max_results": 1' + "0" * digits + "}"),
    st.text(max_size=60),
)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(["search_emails", "read_email", "return_final_answer"]), arguments=ARGUMENTS)
def test_email_tools_never_raise_on_1000_random_calls(email_world, name, arguments):
    from agentrl_environments.email_agent.mailbox import Mailbox

    box = Mailbox(email_world.database, email_world.data.inboxes[0])
    try:
        outcome = execute(box, name, arguments)
    finally:
        box.close()
    assert isinstance(outcome.content, str) and outcome.content


WAITS_FOR_A_SIGNAL = """
import asyncio, sys
from agentrl.stop_signals import handle_stop_signals

async def main():
    from agentrl.gateway.serve import Gateway

    gateway = Gateway()  # a server in the loop, as a backend runs one
    await gateway.start()
    try:
        print("ready", flush=True)
        await asyncio.sleep(120)
    finally:
        await gateway.stop()
        print("cleaned up", flush=True)

handle_stop_signals()
try:
    asyncio.run(main())
except KeyboardInterrupt:
    sys.exit(130)
"""


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_entry_points_stop_on_signals_even_when_started_as_a_background_job(stop):
    """A shell starts background jobs with SIGINT ignored; the stop handlers undo that."""

    def like_a_background_job() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    process = subprocess.Popen(
        [sys.executable, "-c", WAITS_FOR_A_SIGNAL],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        preexec_fn=like_a_background_job,
        start_new_session=True,
    )
    try:
        assert process.stdout.readline().strip() == "ready"
        started = time.monotonic()
        process.send_signal(stop)
        assert process.wait(timeout=20) == 130 and time.monotonic() - started < 20
        assert process.stdout.read().strip() == "cleaned up"  # the finally blocks ran
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


FILE_SIZE_LIMIT = """
import math, os, resource, signal, sys
from pathlib import Path
from agentrl.tracking import append_metrics, read_metrics
run = Path(sys.argv[1])
append_metrics(run, {"step": 1, "split": "train", "reward_mean": 0.5})
size = (run / "metrics.jsonl").stat().st_size
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # over the limit a write fails (EFBIG) instead of killing us
resource.setrlimit(resource.RLIMIT_FSIZE, (size + 40, size + 40))  # room for part of the next line only
try:
    append_metrics(run, {"step": 2, "split": "train", "note": "x" * 200})
except OSError as error:
    print("refused:", error)
assert (run / "metrics.jsonl").stat().st_size == size, "a torn line was left behind"
print("records:", [r["step"] for r in read_metrics(run)])
"""


def test_a_full_disk_leaves_no_torn_metrics_line(tmp_path):
    """RLIMIT_FSIZE makes a write fail part-way, as a full disk does."""
    result = subprocess.run(
        [sys.executable, "-c", FILE_SIZE_LIMIT, str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "refused:" in result.stdout and "records: [1]" in result.stdout
