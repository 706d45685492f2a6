"""Builders and probes the test modules share: test data that mirrors what vLLM returns, run folders,
processes, and the records W&B writes."""

import asyncio
import atexit
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psutil
from openai.types.chat.chat_completion import Choice
from typer.testing import CliRunner

import agentrl
from agentrl import Trajectory, TrajectoryGroup
from agentrl.records.checkpoints import CheckpointStore
from agentrl.records.tracking import record_step

WORDS = "the quick brown fox jumps over a lazy dog while seven cats watch from the old stone wall".split()


def serve_in_thread(httpd: ThreadingHTTPServer) -> None:
    """Serve a local stand-in server from a daemon thread. Its shutdown() returns within 10 ms: at
    serve_forever's default poll of 0.5 s, each test's teardown waited up to half a second."""
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()


def make_choice(
    token_ids: list[int],
    logprobs: list[float] | None = None,
    *,
    content: str | None = "",
    tool_calls: list[dict[str, Any]] | None = None,
    ids_as_tokens: bool = False,
    prompt_token_ids: list[int] | None = None,
) -> Choice:
    """A Choice as vLLM returns it: ids in `token_ids` (return_token_ids) or spelled `token_id:N`; with
    `prompt_token_ids`, as the backend hands it to the trainer (the engine's prompt put back from the store)."""
    logprobs = logprobs if logprobs is not None else [-0.5] * len(token_ids)
    entries = [
        {"token": f"token_id:{t}" if ids_as_tokens else f"t{t}", "logprob": lp, "bytes": None, "top_logprobs": []}
        for t, lp in zip(token_ids, logprobs)
    ]
    data: dict[str, Any] = {
        "index": 0,
        "finish_reason": "tool_calls" if tool_calls else "stop",
        "message": {"role": "assistant", "content": content, "tool_calls": tool_calls},
        "logprobs": {"content": entries},
    }
    if not ids_as_tokens:
        data["token_ids"] = token_ids
    if prompt_token_ids is not None:
        data["prompt_token_ids"] = prompt_token_ids
    return Choice.model_validate(data)


def synthetic_groups(
    tokenizer: Any, *, seed: int, size: int = 4, num_groups: int | None = None, max_words: int = 30
) -> list[agentrl.TrajectoryGroup]:
    """Groups of sampled answers (real token ids, random words, 3 to `max_words` long) with random
    rewards and made-up sampler logprobs: training input without a server."""
    rng = random.Random(seed)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    groups = []
    for g in range(size if num_groups is None else num_groups):
        trajectories = []
        for _ in range(size):
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, max_words)))
            ids = tokenizer.encode(text, add_special_tokens=False) + [end]
            logprobs = [-rng.uniform(0.5, 4.0) for _ in ids]
            trajectories.append(
                agentrl.Trajectory(
                    messages_and_choices=[
                        {"role": "user", "content": f"Say something about animal number {g}."},
                        make_choice(ids, logprobs, content=tokenizer.decode(ids[:-1])),
                    ],
                    reward=rng.random(),
                )
            )
        groups.append(agentrl.TrajectoryGroup(trajectories))
    return groups


def loss_runs(sequence: Any) -> list[tuple[int, int]]:
    """(start, end) of each run of loss-carrying positions in a training sequence: one per sampled turn."""
    runs: list[tuple[int, int]] = []
    for position, in_loss in enumerate(sequence.loss_mask_T):
        if in_loss and runs and runs[-1][1] == position:
            runs[-1] = (runs[-1][0], position + 1)
        elif in_loss:
            runs.append((position, position + 1))
    return runs


def assert_context_exact(trajectories: list[agentrl.Trajectory], store: Any, tokenizer: Any) -> int:
    """Every sampled turn of these trajectories is trained as exactly the ids the engine sampled, scored in exactly
    the prompt ids it sampled them from (the gateway's record, `/v1/sampled/{id}`). Returns the turns checked."""
    from agentrl.backend.sampled_tokens import fill_sampled_tokens
    from agentrl.rl.engine_context import history_sequences

    (group,) = fill_sampled_tokens([agentrl.TrajectoryGroup(trajectories)], store)
    checked = 0
    for trajectory in group.trajectories:
        for history in (h for h in trajectory.histories() if h.choices()):
            tokenized = history_sequences(history, tokenizer)
            assert tokenized.num_exact_turns == tokenized.num_turns == len(history.choices())
            turns = [(s, run) for s in tokenized.sequences for run in loss_runs(s)]
            assert len(turns) == len(history.choices())
            for choice, (sequence, (start, end)) in zip(history.choices(), turns, strict=True):
                engine = store.get(choice.model_extra["completion_id"])[choice.index]
                assert engine.prompt_token_ids, "the gateway kept the prompt the engine sampled from"
                assert sequence.input_ids_T[:start] == engine.prompt_token_ids, "trained in the engine's context"
                assert sequence.input_ids_T[start:end] == engine.token_ids == choice.model_extra["token_ids"]
                checked += 1
    return checked


async def assert_trains_on_exact_tokens(model: agentrl.TrainableModel, trajectories: list[agentrl.Trajectory]) -> None:
    """The trajectories' trained tokens are exactly the ones the server sampled, each scored in exactly the prompt
    it was sampled from, and they train a step that counts every turn context-exact."""
    backend = model._backend
    turns = assert_context_exact(trajectories, backend.gateway.store, backend.trainer.tokenizer)
    assert turns
    step = await model.get_step()
    result = await model.train([agentrl.TrajectoryGroup(trajectories)], agentrl.TrainConfig(learning_rate=1e-5))
    assert not result.skipped and result.step == step + 1
    assert result.metrics["context_exact_turns"] == result.metrics["sampled_turns"] == turns


def sample_groups():
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "search_emails", "arguments": '{"keywords": "invoice"}'},
    }
    first = Trajectory(
        reward=1.0,
        metrics={"turns": 2},
        logs=["RULER: found it"],
        messages_and_choices=[
            {"role": "user", "content": "How much is the <b>invoice</b>?"},
            make_choice([1, 2], content=None, tool_calls=[call]),
            {"role": "tool", "tool_call_id": "c1", "content": '[{"subject": "Invoice"}]'},
            make_choice([3, 2], content="$525"),
        ],
    )
    second = Trajectory(
        reward=0.0,
        metrics={"turns": 1},
        messages_and_choices=[{"role": "user", "content": "q"}, make_choice([4], content="no idea")],
    )
    return [TrajectoryGroup([first, second])]


def children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE}


def group_of(*answers: str, reward: float = 0.0) -> agentrl.TrajectoryGroup:
    return agentrl.TrajectoryGroup(
        agentrl.Trajectory(
            reward=reward,
            messages_and_choices=[{"role": "user", "content": "Plan a trip."}, {"role": "assistant", "content": a}],
        )
        for a in answers
    )


runner = CliRunner()


def flat(output: str) -> str:
    """Output without rich's box borders and line wrapping, which depend on the terminal's width."""
    return " ".join(output.replace("│", " ").split())


def make_run(base_path):
    run_dir = base_path / "demo" / "agent-1"
    store = CheckpointStore(run_dir)
    for step in range(3):
        store.save(
            step,
            lambda folder: (folder / "adapter_config.json").write_text('{"r": 8, "base_model_name_or_path": "/m"}'),
            {},
        )
    record_step(run_dir, 1, "train", sample_groups(), {"reward_mean": 0.25, "reward_std": 0.1, "train_s": 2.0})
    record_step(run_dir, 2, "train", sample_groups(), {"reward_mean": 0.75, "reward_std": 0.1, "train_s": 2.0})
    record_step(run_dir, 2, "val", sample_groups(), {"reward_mean": 0.5})
    return run_dir


def graded_groups(count: int, size: int = 4, seed: int = 0) -> list[agentrl.TrajectoryGroup]:
    """Groups whose verifiable reward is written into each answer as quality=R (the oracle judge reads it)."""
    rng = random.Random(seed)
    groups = []
    for g in range(count):
        rewards = rng.sample([0.0, 0.2, 0.4, 0.6, 0.8, 1.0], size)
        groups.append(
            agentrl.TrajectoryGroup(
                agentrl.Trajectory(
                    reward=r,
                    messages_and_choices=[
                        {"role": "user", "content": f"Task {g}: pack for a trip."},
                        {"role": "assistant", "content": f"Attempt with quality={r:.1f}."},
                    ],
                )
                for r in rewards
            )
        )
    return groups


def group_processes(pgid: int) -> list[psutil.Process]:
    alive = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass
    return alive


def vllm_server_group(port: int) -> list[psutil.Process]:
    """The processes of the vLLM server listening on `port` (it and its engine), found by its command line:
    a server started afresh and one forked by the suite's zygote (agentrl_vllm.zygote titles it so) alike."""
    for proc in psutil.process_iter(["pid", "cmdline"]):
        words = " ".join(proc.info["cmdline"] or []).split()
        if "agentrl_vllm.api_server" in words and "--port" in words:
            if words[words.index("--port") + 1] == str(port):
                return group_processes(proc.pid)
    return []


BLOCK = 32 * 1024  # W&B's transaction log: a 7-byte file header, then leveldb-style 32 KiB blocks of records


def wandb_records(path: Path) -> list:
    """The protobuf records of one W&B run file (`run-ID.wandb`), as the real wandb library wrote them."""
    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    records, pending, offset = [], b"", 7
    while offset + 7 <= len(data):
        if BLOCK - offset % BLOCK < 7:  # a block's tail too short for a header is padding
            offset += BLOCK - offset % BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[offset : offset + 7])
        if kind == 0:  # zero padding at the end of a block
            offset += BLOCK - offset % BLOCK
            continue
        pending += data[offset + 7 : offset + 7 + length]
        offset += 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            record = wandb_internal_pb2.Record()
            try:
                record.ParseFromString(pending)
            except DecodeError:
                break  # a torn final record (the writer was killed)
            records.append(record)
            pending = b""
    return records


def wandb_history(run_dir: Path, *, killed: int = 0, timeout_s: float = 30.0) -> dict[str, list[dict]]:
    """{W&B run id: [history rows]} for every offline W&B run written under `run_dir`, once all but `killed`
    of the run files end with their exit record: `run.finish()` returns before W&B's service has written
    a file's last records (a CI run under load read a resumed run without its history row)."""
    paths = sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb"))
    deadline = time.monotonic() + timeout_s
    while True:
        records = {path: wandb_records(path) for path in paths}
        ended = sum(1 for r in records.values() if r and r[-1].WhichOneof("record_type") == "exit")
        if ended >= len(paths) - killed:
            break
        assert time.monotonic() < deadline, f"{len(paths) - ended} of {len(paths)} W&B run files have no exit record"
        time.sleep(0.05)
    runs: dict[str, list[dict]] = {}
    for path in paths:
        rows = runs.setdefault(path.stem.removeprefix("run-"), [])
        for record in records[path]:
            if record.WhichOneof("record_type") == "history":
                rows.append(
                    {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
                )
    return runs


async def alternating_reward_groups(served_model: Any, *, size: int = 4) -> list[agentrl.TrajectoryGroup]:
    """Real rollouts on the session's server (`size` groups of `size`), with rewards alternating 0/1 so
    every group carries a signal."""
    from agentrl_environments.larger_number.task import rollout, scenarios

    groups = await agentrl.gather_trajectory_groups(
        [
            agentrl.TrajectoryGroup(rollout(served_model, s) for _ in range(size))
            for s in scenarios("train", size, seed=11)
        ],
        show_progress=False,
    )
    return [
        agentrl.TrajectoryGroup([t.model_copy(update={"reward": float(i % 2)}) for i, t in enumerate(g.trajectories)])
        for g in groups
    ]


def model_on_a_server_seam(
    tiny_model_path: str, tmp_path: Any, server: Any, *, trainer_device: str, ranks: int = 1, sharded: bool = False
) -> Any:
    """A model registered by hand on a LocalBackend whose trainer (`ranks` of it, `sharded`), checkpoints
    and step transaction are real (the tiny model) and whose inference server is `server`, a seam the
    test controls. Returns the model's session (its trainer, store and lock)."""
    import functools

    from agentrl.backend.engine import Engine
    from agentrl.backend.local import LocalBackend
    from agentrl.backend.run_lock import RunLock
    from agentrl.backend.session import ModelSession
    from agentrl.backend.training.placement import TrainerPlacement, start_trainer
    from agentrl.records.checkpoints import CheckpointStore

    model = agentrl.TrainableModel(name="m", project="p", base_path=str(tmp_path))
    backend = LocalBackend(trainer_device=trainer_device)
    trainer = start_trainer(tiny_model_path, TrainerPlacement(ranks=ranks, sharded=sharded))
    trainer.add_adapter("default", agentrl.LoRAConfig())
    backend._engine = Engine(model.base_model, tiny_model_path, server, trainer, vocab_size=49152)
    store, lock = CheckpointStore(model.run_dir), RunLock(model.run_dir)
    lock.acquire()
    store.save(0, functools.partial(trainer.save, "default"), {"metrics": {}})
    session = ModelSession(model, "default", store, lock, trainer, server, backend._trainer_thread)
    backend.sessions[str(model.run_dir.resolve())] = session
    model._backend = backend
    return session


class AdapterSlots:
    """The server seam of a CPU host: it takes adapters by name (the trainer and checkpoints are real), each
    in a moment, so a swap has a width on the timeline."""

    devices = 0

    async def load_adapter(self, name, path) -> None:
        await asyncio.sleep(0.01)

    async def unload_adapter(self, name) -> None: ...

    def death_notice(self) -> None:
        return None


def spans_by_track(events: list[dict]) -> dict[str, list[dict]]:
    """A timeline's spans ("X" events) by the name of their track."""
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M"}
    tracks: dict[str, list[dict]] = {}
    for event in (e for e in events if e["ph"] == "X"):
        tracks.setdefault(names[event["tid"]], []).append(event)
    return tracks


def as_another_host(
    home: Path, token: str, args: list[str], *, cpus: list[int] | None = None, torchrun: bool = False
) -> subprocess.Popen[bytes]:
    """`agentrl ARGS` as another host would run it: its own process group, working folder, home, caches and
    temporary folder under `home` (nothing on disk shared with the head), AGENTRL_JOIN_TOKEN=`token`, reaching
    the head over loopback; pinned to `cpus` when given; launched by torchrun (one process) when asked."""
    # A temporary folder of its own, short: vLLM's engine sockets live there, and a socket's path has 107 bytes.
    # It holds the other host's compile caches (~150 MB), so it goes when the suite's process ends.
    temporary = tempfile.mkdtemp(prefix="host-")
    atexit.register(shutil.rmtree, temporary, ignore_errors=True)
    env = {**os.environ, "AGENTRL_JOIN_TOKEN": token, "HOME": str(home), "XDG_CACHE_HOME": str(home / "cache"),
           "HF_HOME": str(home / "hf"), "TMPDIR": temporary}  # fmt: skip
    pinned = ["taskset", "-c", ",".join(map(str, cpus))] if cpus else []
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1"] if torchrun else []
    command = [*pinned, sys.executable, *launcher, "-m", "agentrl.cli", *args]
    return subprocess.Popen(command, cwd=home, env=env, start_new_session=True)


def join_from_another_host(
    home: Path, port: int, token: str, *, cpus: list[int] | None = None, torchrun: bool = False
) -> subprocess.Popen[bytes]:
    """`agentrl backend rank --join 127.0.0.1:PORT` from another "host" (`as_another_host`), with one thread, or
    one per core of `cpus`."""
    threads = len(cpus) if cpus else 1
    args = ["backend", "rank", "--join", f"127.0.0.1:{port}", "--threads", str(threads)]
    return as_another_host(home, token, args, cpus=cpus, torchrun=torchrun)
