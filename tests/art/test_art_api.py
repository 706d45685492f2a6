"""agentrl.art against ART 0.5.18's public API (../shared/art-0.5.18.md), name by name, fast tier.

Each name of the facts file resolves at ART's import path and its signature takes ART's keywords;
then ART's objects behave as ART users use them (groups, gather, retry, models), what agentrl does
not run raises naming the agentrl way, and checkpoints round-trip through a real S3-compatible
server on loopback (moto's server mode) and through a local folder.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import os
import socket
import subprocess
import sys
import time

import pytest
from openai.types.chat.chat_completion import Choice

import agentrl
import agentrl.art as art

# (module, name, ART's keyword names that its signature must take)
ART_NAMES = [
    ("agentrl.art", "dev", None),
    ("agentrl.art", "auto_trajectory", ["required"]),
    ("agentrl.art", "capture_auto_trajectory", ["coroutine"]),
    ("agentrl.art", "gather_trajectories", ["trajectories", "pbar_desc", "pbar_total_completion_tokens", "max_exceptions"]),
    ("agentrl.art", "gather_trajectory_groups", ["groups", "pbar_desc", "pbar_total_completion_tokens",
                                                  "max_exceptions", "max_metrics", "after_each"]),
    ("agentrl.art", "trajectory_group_batches", ["groups", "batch_size", "max_batch_exceptions", "max_concurrent_batches",
                                               "skip_batches", "pbar_desc", "pbar_total_completion_tokens"]),
    ("agentrl.art", "Backend", None),
    ("agentrl.art", "LocalBackend", ["in_process", "path", "gpu_cost_per_hour_usd", "enable_expert_replay"]),
    ("agentrl.art", "LocalTrainResult", ["step", "metrics", "checkpoint_path"]),
    ("agentrl.art", "LoRAConfig", ["rank", "alpha", "dropout", "target_modules", "bias", "use_rslora"]),
    ("agentrl.art.dev", "LoRAConfig", ["rank", "alpha", "dropout", "target_modules", "init_weights"]),
    ("agentrl.art", "MegatronTopologyConfig", None),
    ("agentrl.art", "ServerlessBackend", None),
    ("agentrl.art", "ServerlessTrainResult", None),
    ("agentrl.art", "Messages", None),
    ("agentrl.art", "MessagesAndChoices", None),
    ("agentrl.art", "Tools", None),
    ("agentrl.art", "Model", ["name", "project", "entity", "id", "config", "inference_api_key", "inference_base_url",
                              "inference_model_name", "base_path", "report_metrics"]),
    ("agentrl.art", "TrainableModel", ["name", "project", "entity", "id", "run_id", "config", "base_model",
                                       "lora_config", "base_path", "report_metrics", "_internal_config"]),
    ("agentrl.art", "retry", ["max_attempts", "delay", "backoff_factor", "exceptions", "on_retry"]),
    ("agentrl.art", "TrainSFTConfig", ["learning_rate", "batch_size"]),
    ("agentrl.art", "TrainConfig", ["learning_rate", "kl_penalty_coef", "kl_penalty_source",
                                    "grad_accumulation_sequences", "beta"]),
    ("agentrl.art", "TrainResult", ["step", "metrics"]),
    ("agentrl.art", "Trajectory", ["messages_and_choices", "tools", "additional_histories", "reward", "metrics",
                                   "metadata", "logs"]),
    ("agentrl.art", "TrajectoryGroup", ["trajectories", "exceptions", "metadata", "metrics", "logs"]),
    ("agentrl.art", "capture_yielded_trajectory", ["coroutine"]),
    ("agentrl.art", "yield_trajectory", ["trajectory"]),
    ("agentrl.art.local", "LocalBackend", ["path"]),
    ("agentrl.art.local.backend", "LocalBackend", ["path"]),
    ("agentrl.art.trajectories", "TrajectoryGroup", None),
    ("agentrl.art.types", "MessagesAndChoices", None),
    ("agentrl.art.rewards", "ruler_score_group", ["group", "judge_model", "extra_litellm_params", "rubric",
                                                  "swallow_exceptions", "debug"]),
    ("agentrl.art.rewards", "ruler", ["message_lists", "judge_model", "extra_litellm_params", "rubric", "tools", "debug"]),
    ("agentrl.art.rewards.ruler", "ruler_score_group", None),
    ("agentrl.art.utils", "iterate_dataset", ["dataset", "groups_per_step", "num_epochs", "initial_step", "use_tqdm"]),
    ("agentrl.art.utils.iterate_dataset", "iterate_dataset", None),
    ("agentrl.art.utils", "limit_concurrency", ["n", "derive_key"]),
    ("agentrl.art.utils", "retry", ["max_attempts", "delay", "backoff_factor", "exceptions", "on_retry"]),
    ("agentrl.art.utils", "format_message", ["message"]),
    ("agentrl.art.utils", "get_model_step", ["model"]),
    ("agentrl.art.utils", "log_http_errors", None),
    ("agentrl.art.utils", "record_provenance", ["run", "provenance"]),
    ("agentrl.art.utils", "strip_logprobs", None),
    ("agentrl.art.utils.strip_logprobs", "strip_logprobs", None),
    ("agentrl.art.utils.litellm", "convert_litellm_choice_to_openai", None),
    ("agentrl.art.utils.sft", "train_sft_from_file", ["model", "file_path", "epochs", "learning_rate", "batch_size"]),
    ("agentrl.art.utils.sft", "create_sft_dataset_iterator", ["trajectories", "epochs", "batch_size", "chunk_size"]),
    ("agentrl.art.utils.benchmarking", "load_trajectories", ["project_name", "models", "art_path"]),
    ("agentrl.art.utils.benchmarking", "training_progress_chart", None),
    ("agentrl.art.utils.benchmarking", "percentage_comparison_bar_chart", None),
    ("agentrl.art.dev", "TrainConfig", None),
    ("agentrl.art.dev", "InternalModelConfig", None),
    ("agentrl.art.dev", "InitArgs", None),
    ("agentrl.art.dev", "EngineArgs", None),
    ("agentrl.art.dev", "PeftArgs", None),
    ("agentrl.art.dev", "TrainerArgs", None),
    ("agentrl.art.dev", "OpenAIServerConfig", None),
    ("agentrl.art.dev", "ServerArgs", None),
    ("agentrl.art.dev", "get_openai_server_config", None),
    ("agentrl.art.dev", "is_dedicated_mode", None),
    ("agentrl.art.dev", "validate_dedicated_config", None),
    ("agentrl.art.mcp", "MCPTool", ["name", "description", "parameters"]),
    ("agentrl.art.mcp", "MCPResource", ["uri", "name", "description", "mime_type"]),
    ("agentrl.art.mcp", "GeneratedScenario", ["task", "difficulty"]),
    ("agentrl.art.mcp", "GeneratedScenarioCollection", None),
    ("agentrl.art.mcp", "complete_task_tool", None),
    ("agentrl.art.mcp", "generate_scenarios", ["tools", "resources", "num_scenarios", "show_preview",
                                               "custom_instructions", "generator_model", "generator_api_key",
                                               "generator_base_url"]),
    ("agentrl.art.langgraph", "wrap_rollout", ["model", "fn"]),
    ("agentrl.art.langgraph", "init_chat_model", ["model", "model_provider", "configurable_fields", "config_prefix",
                                                  "invoke_timeout"]),
    ("agentrl.art.pipeline_trainer", "PipelineTrainer", [
        "model", "backend", "rollout_fn", "scenarios", "config", "eval_fn", "num_rollout_workers", "min_batch_size",
        "max_batch_size", "max_steps_off_policy", "queue_maxsize", "pipeline", "autotune", "grad_accumulation_sequences",
        "limit_mean_steps_off_policy", "score_reference_groups_per_step", "score_reference_rollouts_per_group",
        "optimizer_save_interval", "rollout_executor", "learning_rate", "loss_fn", "loss_fn_config",
        "normalize_advantages", "adam_params", "packed_sequence_length", "kl_penalty_coef", "kl_penalty_step_lag",
        "megatron_topology", "max_steps", "discard_queue_multiplier", "log_interval_seconds", "status_ewa_alpha",
        "total_scenarios", "eval_every_n_steps", "eval_at_start", "save_checkpoint", "checkpoint_retention_strategy",
        "checkpoint_retention_interval", "resume"]),
]  # fmt: skip

BACKEND_TRAIN_KEYS = [
    "learning_rate", "loss_fn", "loss_fn_config", "normalize_advantages", "adam_params", "kl_penalty_coef",
    "kl_penalty_reference_step", "kl_ref_adapter_path", "kl_penalty_source", "epsilon", "epsilon_high",
    "advantage_balance", "scale_rewards", "importance_sampling_level", "max_negative_advantage_importance_sampling_weight",
    "mask_prob_ratio", "kimi_k2_tau", "precalculate_logprobs", "allow_training_without_logprobs", "plot_tensors",
    "truncated_importance_sampling", "scale_learning_rate_by_reward_std_dev", "logprob_calculation_chunk_size",
    "packed_sequence_length", "megatron_topology", "num_trajectories_learning_rate_multiplier_power",
    "save_checkpoint", "verbose", "optimizer_save_interval", "final_training_step", "grad_accumulation_sequences",
]  # fmt: skip


@pytest.mark.parametrize(("module", "name", "keywords"), ART_NAMES, ids=[f"{m}.{n}" for m, n, _ in ART_NAMES])
def test_each_art_name_resolves_at_its_import_path_and_takes_arts_keywords(module, name, keywords):
    value = getattr(importlib.import_module(module), name)
    if keywords:
        target = value
        if inspect.isclass(value) and hasattr(value, "model_fields"):  # pydantic: fields (and ART's extra keywords)
            accepted = set(value.model_fields) | {"inference_api_key", "inference_base_url", "lora_config",
                                                  "_internal_config"}  # fmt: skip
            assert set(keywords) <= accepted, sorted(set(keywords) - accepted)
            return
        if inspect.isclass(value) and issubclass(value, dict):  # a TypedDict, as ART's: its keys
            assert set(keywords) <= set(value.__annotations__), sorted(set(keywords) - set(value.__annotations__))
            return
        parameters = inspect.signature(target).parameters
        assert set(keywords) <= set(parameters), sorted(set(keywords) - set(parameters))


def test_backend_train_takes_every_art_training_key():
    from agentrl.art.training import TRAIN_KEYS

    assert set(BACKEND_TRAIN_KEYS) <= set(TRAIN_KEYS)
    assert set(art.dev.TrainConfig.__annotations__) <= set(TRAIN_KEYS)


@pytest.mark.parametrize("cls", [art.ServerlessBackend, art.MegatronTopologyConfig])
def test_what_agentrl_does_not_run_imports_and_raises_on_use_naming_the_agentrl_way(cls):
    with pytest.raises(agentrl.ConfigurationError, match="agentrl"):
        cls()


async def rollout(reward: float, fail: bool = False) -> agentrl.Trajectory:
    await asyncio.sleep(0)
    if fail:
        raise ValueError(f"rollout {reward} failed")
    return art.Trajectory(messages_and_choices=[{"role": "user", "content": None}], reward=reward)


async def test_a_group_built_from_coroutines_is_awaitable_sized_and_iterates_trajectories():
    group = await art.TrajectoryGroup(rollout(r) for r in (0.0, 1.0, 0.5))
    assert len(group) == 3 and [t.reward for t in group] == [0.0, 1.0, 0.5]
    assert [t for t in group if isinstance(t, art.Trajectory)] == group.trajectories  # ART's filter keeps them all
    mixed = art.TrajectoryGroup([art.Trajectory(reward=1.0), ValueError("tool crashed")], exceptions=[KeyError("k")])
    assert len(mixed) == 1 and [e.type for e in mixed.exceptions] == ["KeyError", "ValueError"]
    import copy

    assert copy.deepcopy(group) == group and copy.copy(group).trajectories == group.trajectories


async def test_gather_trajectories_returns_failures_in_place_within_the_budget():
    results = await art.gather_trajectories([rollout(1.0), rollout(2.0, fail=True), rollout(3.0)], max_exceptions=1)
    assert results[0].reward == 1.0 and isinstance(results[1], ValueError) and results[2].reward == 3.0
    with pytest.raises(agentrl.RolloutError):
        await art.gather_trajectories([rollout(1.0), rollout(2.0, fail=True)], pbar_desc=None)


async def test_gather_trajectory_groups_takes_async_functions_returning_groups():
    async def make_group(base: float) -> art.TrajectoryGroup:
        return await art.TrajectoryGroup(rollout(base + i) for i in range(2))

    groups = await art.gather_trajectory_groups([make_group(0.0), make_group(10.0)], pbar_desc=None)
    assert [[t.reward for t in g] for g in groups] == [[0.0, 1.0], [10.0, 11.0]]
    batches = [b async for b in art.trajectory_group_batches(
        [art.TrajectoryGroup([rollout(float(i))]) for i in range(5)], batch_size=2, pbar_desc=None)]  # fmt: skip
    assert [[g.trajectories[0].reward for g in b] for b in batches] == [[0.0, 1.0], [2.0, 3.0], [4.0]]
    skipped = [b async for b in art.trajectory_group_batches(
        [art.TrajectoryGroup([rollout(float(i))]) for i in range(5)], batch_size=2, skip_batches=1, pbar_desc=None)]  # fmt: skip
    assert [[g.trajectories[0].reward for g in b] for b in skipped] == [[2.0, 3.0], [4.0]]


def test_retry_works_on_sync_and_async_functions_with_backoff_and_on_retry():
    seen = []

    @art.retry(max_attempts=3, delay=0.01, backoff_factor=2.0, exceptions=(TimeoutError,),
               on_retry=lambda error, attempt: seen.append((type(error).__name__, attempt)))  # fmt: skip
    def flaky_sync() -> str:
        if len(seen) < 2:
            raise TimeoutError
        return "ok"

    assert flaky_sync() == "ok" and seen == [("TimeoutError", 1), ("TimeoutError", 2)]

    @art.retry(max_attempts=2, delay=0.0, exceptions=(TimeoutError,))
    async def never() -> None:
        raise ValueError("not retried")

    with pytest.raises(ValueError, match="not retried"):
        asyncio.run(never())


async def test_limit_concurrency_per_derived_key():
    from agentrl.art.utils import limit_concurrency

    running: dict[str, int] = {}
    peaks: dict[str, int] = {}

    @limit_concurrency(1, derive_key=lambda server, query: server)
    async def call(server: str, query: str) -> None:
        running[server] = running.get(server, 0) + 1
        peaks[server] = max(peaks.get(server, 0), running[server])
        await asyncio.sleep(0.01)
        running[server] -= 1

    await asyncio.gather(*(call(s, str(i)) for i in range(3) for s in ("a", "b")))
    assert peaks == {"a": 1, "b": 1}


async def test_yielded_and_captured_trajectories():
    async def deep() -> None:
        art.yield_trajectory(art.Trajectory(reward=0.25))

    assert (await art.capture_yielded_trajectory(deep())).reward == 0.25
    with pytest.raises(RuntimeError, match="capture_yielded_trajectory"):
        art.yield_trajectory(art.Trajectory())


def test_trajectory_for_logging_policy_versions_and_strip_logprobs():
    from agentrl.art.utils import format_message, strip_logprobs

    def choice(step: int) -> Choice:
        return Choice.model_validate({"index": 0, "finish_reason": "stop", "policy_step": step,
            "message": {"role": "assistant", "content": "hi"},
            "logprobs": {"content": [{"token": "hi", "logprob": -0.1, "bytes": None, "top_logprobs": []}]}})  # fmt: skip

    trajectory = art.Trajectory(messages_and_choices=[{"role": "user", "content": "x"}, choice(2),
                                                      {"role": "user", "content": "y"}, choice(3)], reward=1.0)  # fmt: skip
    assert (trajectory.initial_policy_version, trajectory.final_policy_version) == (2, 3)
    assert trajectory.start_time.tzinfo is not None
    logged = trajectory.for_logging()
    messages = json.loads(json.dumps(logged))["messages"]
    assert messages[1] == {"role": "assistant", "content": "hi", "trainable": True}  # ART's flags
    assert messages[0] == {"role": "user", "content": "x", "trainable": False}
    stripped = strip_logprobs(art.TrajectoryGroup([trajectory]))
    assert all(c.logprobs is None for c in stripped.trajectories[0].choices())
    assert trajectory.choices()[0].logprobs is not None  # the original is untouched
    assert format_message(choice(1)) == "assistant: hi"


def test_sft_iterator_and_file(tmp_path):
    from agentrl.art.utils.sft import create_sft_dataset_iterator, load_trajectories_from_file

    path = tmp_path / "sft.jsonl"
    path.write_text("\n".join(json.dumps({"messages": [{"role": "user", "content": f"q{i}"},
                    {"role": "assistant", "content": f"a{i}"}]}) for i in range(5)))  # fmt: skip
    trajectories = load_trajectories_from_file(path)
    chunks = list(create_sft_dataset_iterator(trajectories, epochs=2, batch_size=2, chunk_size=1, initial_step=1))
    assert [(c.step, c.epoch, c.epoch_step, len(c.trajectories)) for c in chunks] == [
        (1, 0, 1, 2), (2, 0, 2, 1), (3, 1, 0, 2), (4, 1, 1, 2), (5, 1, 2, 1)]  # fmt: skip
    path.write_text('{"text": "no messages"}\n')
    with pytest.raises(agentrl.ConfigurationError, match="sft.jsonl:1"):
        load_trajectories_from_file(path)


def test_benchmarking_reads_recorded_trajectories(tmp_path):
    from agentrl.art.utils.benchmarking import (
        load_trajectories,
        percentage_comparison_bar_chart,
        training_progress_chart,
    )
    from agentrl.records.tracking import write_trajectories

    for name, rewards in (("base", [0.2, 0.4]), ("trained", [0.8, 1.0])):
        group = art.TrajectoryGroup([art.Trajectory(reward=r, metrics={"turns": 2}) for r in rewards])
        write_trajectories(tmp_path / "proj" / "models" / name, 3, "val", [group])
    rows = load_trajectories("proj", art_path=str(tmp_path))
    assert {(r["model"], r["step"], r["reward"]) for r in rows} == {
        ("base", 3, 0.2), ("base", 3, 0.4), ("trained", 3, 0.8), ("trained", 3, 1.0)}  # fmt: skip
    assert training_progress_chart(rows).axes and percentage_comparison_bar_chart(rows).axes


def test_the_server_samples_at_temperature_one_when_a_request_omits_it():
    from agentrl.backend.serving.server import server_command

    command = server_command("m", "base", 1, agentrl.ServerConfig(), max_lora_rank=8, gpu=False)
    assert command[command.index("--generation-config") + 1] == "vllm"


# --- checkpoints to object storage, against a real S3-compatible server on loopback ---


@pytest.fixture(scope="module")
def s3_endpoint():
    pytest.importorskip("moto")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    saved = {k: os.environ.get(k) for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                            "AWS_DEFAULT_REGION")}  # fmt: skip
    os.environ.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test",
                      AWS_DEFAULT_REGION="us-east-1")  # fmt: skip
    try:
        import boto3

        boto3.client("s3").create_bucket(Bucket="runs")
        yield endpoint
    finally:
        for key, value in saved.items():
            os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)
        server.terminate()
        server.wait(timeout=10)


def _fake_run(tmp_path, name: str, steps: list[int]) -> art.TrainableModel:
    from agentrl.records.checkpoints import CheckpointStore
    from agentrl.records.tracking import append_metrics

    model = art.TrainableModel(name=name, project="proj", base_path=str(tmp_path / ".art"))
    store = CheckpointStore(model.run_dir)
    for step in steps:
        store.save(step, lambda folder, s=step: (folder / "adapter_model.safetensors").write_bytes(bytes([s]) * 64),
                   {"metrics": {}})  # fmt: skip
        append_metrics(model.run_dir, {"step": step, "split": "train", "reward_mean": step / 10})
    return model


@pytest.mark.parametrize("where", ["s3", "folder"])
async def test_checkpoints_round_trip_through_object_storage_and_fork(tmp_path, where, request):
    from agentrl.art.local import LocalBackend

    bucket = "s3://runs" if where == "s3" else str(tmp_path / "bucket")
    if where == "s3":
        request.getfixturevalue("s3_endpoint")
    backend = LocalBackend()  # no `path`: each model's base_path holds its run
    source = _fake_run(tmp_path, "agent", [0, 1, 2])
    await backend._experimental_push_to_s3(source, s3_bucket=bucket, prefix="exp")
    elsewhere = art.TrainableModel(name="agent", project="proj", base_path=str(tmp_path / "other"))
    latest = await backend._experimental_pull_from_s3(elsewhere, s3_bucket=bucket, prefix="exp", only_step=1)
    assert latest == 1 and sorted(p.name for p in (elsewhere.run_dir / "checkpoints").iterdir()) == ["0001"]
    assert (elsewhere.run_dir / "checkpoints" / "0001" / "adapter_model.safetensors").read_bytes() == bytes([1]) * 64
    assert (elsewhere.run_dir / "metrics.jsonl").exists()
    # a second pull adds what is missing and never overwrites what the folder has
    (elsewhere.run_dir / "metrics.jsonl").write_text("mine\n")
    latest = await backend._experimental_pull_from_s3(elsewhere, s3_bucket=bucket, prefix="exp", exclude=["logs"])
    assert latest == 2 and (elsewhere.run_dir / "metrics.jsonl").read_text() == "mine\n"
    forked = art.TrainableModel(name="fork", project="proj", base_path=str(tmp_path / "forks"))
    step = await backend._experimental_fork_checkpoint(
        forked, "agent", from_project="proj", from_s3_bucket=bucket, prefix="exp", not_after_step=1
    )
    assert step == 1 and (forked.run_dir / "checkpoints" / "0001" / "agentrl-checkpoint.json").exists()
    with pytest.raises(agentrl.ConfigurationError, match="already has checkpoints"):
        await backend._experimental_fork_checkpoint(forked, "agent", from_s3_bucket=bucket, prefix="exp")
    with pytest.raises(agentrl.ConfigurationError, match="only_step=7"):
        await backend._experimental_pull_from_s3(elsewhere, s3_bucket=bucket, prefix="exp", only_step=7)


async def test_a_prompted_model_registers_logs_and_keeps_state(tmp_path):
    from agentrl.records.tracking import read_metrics

    baseline = art.Model(name="gpt-baseline", project="proj", base_path=str(tmp_path))
    backend = art.LocalBackend(path=str(tmp_path))
    await baseline.register(backend)
    assert baseline.backend() is backend and await baseline.get_step() == 0
    await baseline.log([art.Trajectory(reward=0.5), art.Trajectory(reward=1.0)], split="val", metrics={"cost": 0.1})
    (record,) = read_metrics(tmp_path / "proj" / "models" / "gpt-baseline")
    assert (record["split"], record["reward_mean"], record["cost"]) == ("val", 0.75, 0.1)
    assert baseline.read_state() is None
    baseline.overwrite_state({"epoch": 1})
    assert baseline.merge_state({"seen": 3}) == {"epoch": 1, "seen": 3} == baseline.read_state()
    baseline.overwrite_state({"epoch": 1, "best": {"reward": 0.5, "step": 2}})
    merged = baseline.merge_state({"best": {"reward": 0.7}})  # ART merges nested dicts key by key
    assert merged == {"epoch": 1, "best": {"reward": 0.7, "step": 2}} == baseline.read_state()


HOSTILE_KEYS = [
    "../../../outside-1.txt",  # dot-dot parts climbing out of the run folder
    "checkpoints/0001/../../../../outside-2.txt",  # the same inside a checkpoint's files
    "/tmp-absolute/outside-3.txt",  # an absolute path after the run's prefix
    "checkpoints/0001/evil.pth",  # a file no checkpoint has
    "checkpoints/1²/adapter_model.safetensors",  # a step folder that is not ASCII digits
]


@pytest.mark.parametrize("where", ["s3", "folder"])
@pytest.mark.parametrize("hostile", HOSTILE_KEYS)
async def test_a_pull_from_a_hostile_bucket_writes_nothing_outside_the_run_folder(tmp_path, where, hostile, request):
    from agentrl.art.local import LocalBackend

    backend = LocalBackend()
    source = _fake_run(tmp_path, "agent", [0, 1])
    bucket = "s3://runs" if where == "s3" else str(tmp_path / "bucket")
    if where == "s3":
        request.getfixturevalue("s3_endpoint")
        import boto3

        client = boto3.client("s3")
        for stale in client.list_objects_v2(Bucket="runs", Prefix="hostile/").get("Contents", []):
            client.delete_object(Bucket="runs", Key=stale["Key"])
    await backend._experimental_push_to_s3(source, s3_bucket=bucket, prefix="hostile")
    key = f"hostile/proj/models/agent/{hostile}"
    if where == "s3":
        client.put_object(Bucket="runs", Key=key, Body=b"pwned")
        assert any(o["Key"] == key for o in client.list_objects_v2(Bucket="runs", Prefix="hostile/")["Contents"])
    else:  # a folder can hold only what a file system spells: the names that stay names
        if ".." in hostile or hostile.startswith("/"):
            pytest.skip("a folder source cannot hold this key")
        (tmp_path / "bucket" / key).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "bucket" / key).write_bytes(b"pwned")
    victim = tmp_path / "outside-2.txt"
    victim.write_text("mine")
    elsewhere = art.TrainableModel(name="agent", project="proj", base_path=str(tmp_path / "pulled" / "a" / "b"))
    before = {p for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(agentrl.ConfigurationError, match="nothing was pulled"):
        await backend._experimental_pull_from_s3(elsewhere, s3_bucket=bucket, prefix="hostile")
    with pytest.raises(agentrl.ConfigurationError, match="nothing was pulled"):
        await backend._experimental_fork_checkpoint(
            art.TrainableModel(name="fork", project="proj", base_path=str(tmp_path / "forks" / "a" / "b")),
            "agent", from_project="proj", from_s3_bucket=bucket, prefix="hostile",
        )  # fmt: skip
    assert {p for p in tmp_path.rglob("*") if p.is_file()} == before  # not one file written, anywhere
    assert victim.read_text() == "mine"


async def test_a_pull_follows_no_symbolic_link(tmp_path):
    from agentrl.art.local import LocalBackend

    backend = LocalBackend()
    source = _fake_run(tmp_path, "agent", [0, 1])
    secret = tmp_path / "secret.txt"
    secret.write_text("the user's secret")
    (source.run_dir / "notes.txt").symlink_to(secret)  # a link in the source is never pushed nor pulled
    bucket = tmp_path / "bucket"
    await backend._experimental_push_to_s3(source, s3_bucket=str(bucket), prefix="p")
    assert not (bucket / "p/proj/models/agent/notes.txt").exists()
    (bucket / "p/proj/models/agent/notes.txt").symlink_to(secret)
    elsewhere = art.TrainableModel(name="agent", project="proj", base_path=str(tmp_path / "pulled"))
    outside = tmp_path / "elsewhere-outside"
    outside.mkdir()
    elsewhere.run_dir.mkdir(parents=True)
    (elsewhere.run_dir / "trajectories").symlink_to(outside)  # a link in the run folder pointing out of it
    (bucket / "p/proj/models/agent/trajectories").mkdir()
    (bucket / "p/proj/models/agent/trajectories/train-0001.jsonl").write_text("{}\n")
    with pytest.raises(agentrl.ConfigurationError, match="outside"):
        await backend._experimental_pull_from_s3(elsewhere, s3_bucket=str(bucket), prefix="p")
    assert not list(outside.iterdir()) and not (elsewhere.run_dir / "notes.txt").exists()
    (elsewhere.run_dir / "trajectories").unlink()
    assert await backend._experimental_pull_from_s3(elsewhere, s3_bucket=str(bucket), prefix="p") == 1
    assert not (elsewhere.run_dir / "notes.txt").exists()  # the source's link was passed over
    assert (elsewhere.run_dir / "trajectories/train-0001.jsonl").read_text() == "{}\n"


async def test_art_layout_a_fork_into_a_backends_path_and_a_pull_after_register(tmp_path, base_model_path):
    """ART keeps runs at {path}/{project}/models/{name}, in storage too; a fork into `LocalBackend(path=...)` is the
    run that registers there (it started from step 0 before), and a pull after `register` (ART's 2048 script) resumes
    from the newest checkpoint pulled. On the real trainer, with the server seam stubbed (no vLLM needed)."""
    from agentrl.art.local import LocalBackend

    source = _fake_run(tmp_path, "agent", [0, 1, 2])
    assert source.run_dir == tmp_path / ".art" / "proj" / "models" / "agent"
    bucket = tmp_path / "bucket"
    await LocalBackend()._experimental_push_to_s3(source, s3_bucket=str(bucket), prefix="exp")
    assert (bucket / "exp" / "proj" / "models" / "agent" / "checkpoints" / "0002").is_dir()
    backend = LocalBackend(path=str(tmp_path / "elsewhere"))
    forked = art.TrainableModel(name="fork", project="proj", base_path=str(tmp_path / "ignored"))
    step = await backend._experimental_fork_checkpoint(forked, "agent", "proj", str(bucket), 1, False, "exp")
    assert step == 1 and forked.run_dir == tmp_path / "elsewhere" / "proj" / "models" / "fork"
    assert (forked.run_dir / "checkpoints" / "0001").is_dir() and not (tmp_path / "ignored").exists()


async def test_capture_auto_trajectory_records_completions_from_any_endpoint(fake):
    """ART's capture records every OpenAI-format completion the coroutine makes, whatever answered it (here a
    stand-in for a hosted API); agentrl's own `capture_trajectory` keeps to its gateway's trained adapters."""
    import openai

    client = openai.AsyncOpenAI(base_url=fake.base_url, api_key="test", max_retries=0)

    async def agent() -> None:
        await client.chat.completions.create(model="gpt-4.1", messages=[{"role": "user", "content": "hi"}])
        art.auto_trajectory(required=True).reward = 0.5

    captured = await art.capture_auto_trajectory(agent())
    assert captured.reward == 0.5 and len(captured.choices()) == 1
    assert captured.messages_and_choices[0] == {"role": "user", "content": "hi"}
    with agentrl.capture_trajectory() as native:
        await client.chat.completions.create(model="gpt-4.1", messages=[{"role": "user", "content": "hi"}])
    assert native.messages_and_choices == []  # not agentrl's gateway: not a trainable turn, not recorded


async def test_a_pull_with_delete_mirrors_the_stored_run_and_keeps_what_it_removes(tmp_path):
    from agentrl.art.local import LocalBackend

    backend = LocalBackend()
    source = _fake_run(tmp_path, "agent", [0, 1])
    bucket = str(tmp_path / "bucket")
    await backend._experimental_push_to_s3(source, s3_bucket=bucket)
    elsewhere = _fake_run(tmp_path / "other", "agent", [0, 1, 2])  # a local step 2 the stored run never had
    (elsewhere.run_dir / "notes.txt").write_text("mine")
    latest = await backend._experimental_pull_from_s3(elsewhere, s3_bucket=bucket, delete=True)
    assert latest == 1 and not (elsewhere.run_dir / "checkpoints" / "0002").exists()  # as ART's sync --delete
    (aside,) = elsewhere.run_dir.glob(".deleted-*")  # moved aside, never deleted
    assert (aside / "notes.txt").read_text() == "mine" and (aside / "checkpoints" / "0002").is_dir()
