"""One vs two inference replicas, and one vs two trainer ranks, on this machine.

    .venv/bin/python -m benchmarks.scale [--requests 128] [--steps 3]

For each replica count, a fresh LocalBackend serves the packaged model (`ServerConfig(replicas=N)`);
the same distinct-prompt chat completions (64 tokens each, greedy, `ignore_eos`) go through the
gateway at concurrency 32 to the model's adapter, after a warm-up; the swap is the time to load a
checkpoint into every replica (what a step's swap waits for), median of 5. On two cores, two
replicas get one core each: the figures show what coordination costs, not a speed-up.

Trainer ranks, without a server: the same GRPO steps (8 groups x 8 answers of 4-120 tokens, real
token ids, default TrainConfig) on one trainer (both cores), on two data-parallel ranks (a core
each) and on two sharded ranks (FSDP2); the median of `--steps` steps after a warm-up step, the
time the ranks spent summing gradients, and the weights each rank holds. Writes
benchmarks/results/scale.json and its table in the docs.

    .venv/bin/python -m benchmarks.scale --hosts [--steps 3]

Two data-parallel ranks on one host against the same two ranks as two "hosts" on this machine (rank 1
joined with `agentrl backend rank --join` from its own process group and folders, over loopback):
what crossing hosts costs, in rendezvous (start), summing gradients, and pushing a checkpoint to the
ranks (a remote rank gets the files over its connection). Then two inference replicas on this host
against one here and one joined with `agentrl backend replica --join` (its adapters pushed over HTTP):
sampling, the swap, the bytes pushed a step, and how long the other host took to join. Writes
benchmarks/results/scale_hosts.json and its tables in the docs.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import secrets
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

import agentrl
from agentrl.foundation.files import write_json_atomic
from benchmarks.gateway import timed_completions
from benchmarks.readme import replace_section
from benchmarks.step_breakdown import RESULTS, machine_label

SCALE_RESULTS = RESULTS.with_name("scale.json")
START, END = "<!-- benchmark:scale:start -->", "<!-- benchmark:scale:end -->"
CONCURRENCY, TOKENS = 32, 64
RANK_SETUPS = {"1 trainer": (1, False), "2 ranks (DDP)": (2, False), "2 ranks (FSDP2)": (2, True)}
HOST_SETUPS = ("2 ranks, one host", "2 ranks, two hosts (loopback)")
HOSTS_START, HOSTS_END = "<!-- benchmark:scale-hosts:start -->", "<!-- benchmark:scale-hosts:end -->"


async def measure(replicas: int, requests: int, *, other_host: bool = False) -> dict[str, Any]:
    """Sampling through the gateway and the swap (a checkpoint into every replica) for `replicas` on this host,
    or (`other_host`) one here and one joined from another "host" on loopback, each on half the cores."""
    from agentrl.backend.serving.remote_replica import RemoteReplica
    from tests.helpers import as_another_host

    cores = sorted(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory() as tmp:
        model = agentrl.TrainableModel(
            name="scale", project="scale", base_path=tmp, server=agentrl.ServerConfig(replicas=replicas - other_host)
        )
        token = secrets.token_urlsafe(16)
        backend = agentrl.LocalBackend(join_token=token if other_host else None)
        agent, join_s = None, None
        try:
            started = time.perf_counter()
            if other_host:  # this host's replica takes the first half of the cores (vLLM inherits them)
                os.sched_setaffinity(0, cores[: len(cores) // 2 or 1])
            try:
                await model.register(backend)
            finally:
                os.sched_setaffinity(0, cores)
            start_s = time.perf_counter() - started
            if other_host:
                (Path(tmp) / "host").mkdir()
                args = ["backend", "replica", "--join", f"127.0.0.1:{backend.gateway.port}"]
                started = time.perf_counter()
                agent = as_another_host(Path(tmp) / "host", token, args, cpus=cores[len(cores) // 2 :] or cores)
                while len(backend.gateway.upstream.replicas) < 2:
                    if agent.poll() is not None:
                        raise RuntimeError("the replica agent exited before it joined")
                    await asyncio.sleep(0.5)
                join_s = time.perf_counter() - started
            sampling = {"Authorization": f"Bearer {backend.gateway.token}"}
            async with httpx.AsyncClient(timeout=600, headers=sampling) as client:
                url, name = backend.base_url, model.inference_name
                await timed_completions(client, url, name, CONCURRENCY, CONCURRENCY, distinct_prompts=True)  # warm-up
                before = [r.sent for r in backend.gateway.upstream.replicas]
                _, tokens, wall_s = await timed_completions(
                    client, url, name, requests, CONCURRENCY, distinct_prompts=True, max_tokens=TOKENS
                )
                sent = [r.sent - b for r, b in zip(backend.gateway.upstream.replicas, before)]
            checkpoint = backend.session(model).store.path(0)
            swaps, pushes = [], []
            for index in range(5):
                swap_started = time.perf_counter()
                await backend.server.load_adapter(f"swap-{index}@0", checkpoint)
                swaps.append(time.perf_counter() - swap_started)
                pushes += [(r.push_s, r.pushed_bytes) for r in backend.server.replicas if isinstance(r, RemoteReplica)]
                await backend.server.unload_adapter(f"swap-{index}@0")
        finally:
            await backend.close()
            if agent is not None:
                agent.terminate()
                agent.wait(60)
    result = {
        "replicas": replicas,
        "other_host": other_host,
        "start_s": start_s,
        "join_s": join_s,
        "requests": requests,
        "tokens_per_s": tokens / wall_s,
        "requests_per_replica": sent,
        "swap_s_median": statistics.median(swaps),
        "push_s_median": statistics.median(s for s, _ in pushes) if pushes else None,
        "push_bytes": pushes[0][1] if pushes else None,
    }
    print(result, flush=True)
    return result


def measure_ranks(setup: str, steps: int) -> dict[str, Any]:
    """GRPO step time of one trainer or of trainer ranks on the same synthetic groups."""
    from transformers import AutoTokenizer

    from agentrl.backend.processes import free_port
    from agentrl.backend.training.ranks.rank_hosts import JoinPoint
    from agentrl.backend.training.ranks.ranks import TrainerRanks
    from agentrl.backend.training.trainer import Trainer
    from agentrl.foundation.base_models import resolve_base_model
    from tests.helpers import join_from_another_host, synthetic_groups

    ranks, sharded = RANK_SETUPS.get(setup, (2, False))
    path = resolve_base_model("smollm2-135m-instruct")
    tokenizer = AutoTokenizer.from_pretrained(path)
    folder, other_host, join = Path(tempfile.mkdtemp(prefix="agentrl-scale-")), None, None
    if setup == HOST_SETUPS[1]:
        port, token = free_port(), secrets.token_urlsafe(16)
        cores = sorted(os.sched_getaffinity(0))  # the "hosts" split this machine's cores, as two ranks on it do
        half = len(cores) // 2 or 1
        other_host = join_from_another_host(folder, port, token, cpus=cores[half:] or cores)
        join = JoinPoint("127.0.0.1", port, token, remote_ranks=1)
        os.sched_setaffinity(0, cores[:half])  # the head's rank 0 takes this process's cores
    started = time.perf_counter()
    try:
        trainer = Trainer(path) if ranks == 1 else TrainerRanks(path, ranks=ranks, sharded=sharded, join=join)
    finally:
        if join is not None:
            os.sched_setaffinity(0, cores)
    trainer.add_adapter("default", agentrl.LoRAConfig())
    start_s = time.perf_counter() - started
    outcomes = []
    try:
        for step in range(steps + 1):  # the first warms up
            groups = synthetic_groups(tokenizer, seed=step, size=8, max_words=80)
            started = time.perf_counter()
            outcome = trainer.train_step("default", groups, agentrl.TrainConfig())
            outcomes.append((time.perf_counter() - started, outcome.metrics))
        held = trainer.parameter_bytes()
        (folder / "checkpoint").mkdir()
        trainer.save("default", folder / "checkpoint")
        started = time.perf_counter()
        trainer.load("default", folder / "checkpoint")  # what a resume asks of every rank
        load_s = time.perf_counter() - started
        checkpoint_bytes = sum(f.stat().st_size for f in (folder / "checkpoint").iterdir())
    finally:
        trainer.close()
        if other_host is not None:
            other_host.wait(30)
        shutil.rmtree(folder, ignore_errors=True)
    timed = outcomes[1:]
    step_s = statistics.median(s for s, _ in timed)
    tokens = statistics.median(m["total_tokens"] for _, m in timed)
    result = {
        "setup": setup,
        "ranks": ranks,
        "sharded": sharded,
        "start_s": start_s,
        "step_s_median": step_s,
        "tokens_per_step": tokens,
        "trained_tokens_per_s": tokens / step_s,
        "allreduce_s_median": statistics.median(m.get("allreduce_s", 0.0) for _, m in timed),
        "allreduce_bytes": statistics.median(m.get("allreduce_bytes", 0.0) for _, m in timed),
        "weights_gib_per_rank": [b / 2**30 for b in held],
        "load_s": load_s,
        "checkpoint_bytes": checkpoint_bytes,
    }
    print(result, flush=True)
    return result


def _replica_row(run: dict[str, Any]) -> str:
    where = "one here, one on another host" if run["other_host"] else "both on one host"
    pushed = f"{run['push_s_median'] * 1000:.0f} ms ({run['push_bytes'] / 2**20:.1f} MiB)" if run["push_bytes"] else "-"
    joined = f"{run['join_s']:.0f} s" if run["join_s"] else "-"
    return (
        f"| {where} | {run['tokens_per_s']:.0f} | {' / '.join(map(str, run['requests_per_replica']))} | "
        f"{run['swap_s_median'] * 1000:.0f} ms | {pushed} | {joined} |"
    )


def compare_hosts(steps: int, requests: int) -> None:
    """Two ranks, and two inference replicas, on one host against two "hosts" on loopback: scale_hosts.json and
    its tables in the docs."""
    runs = [measure_ranks(setup, steps) for setup in HOST_SETUPS]
    replica_runs = [asyncio.run(measure(2, requests, other_host=other)) for other in (False, True)]
    machine = machine_label()
    result = {"machine": machine, "date": datetime.date.today().isoformat(), "runs": runs, "replica_runs": replica_runs}
    write_json_atomic(SCALE_RESULTS.with_name("scale_hosts.json"), result)
    rows = [
        f"| {r['setup']} | {r['start_s']:.1f} s | {r['step_s_median']:.1f} s | {r['allreduce_s_median'] * 1000:.0f} ms "
        f"({r['allreduce_bytes'] / 2**20:.1f} MiB) | {r['load_s']:.2f} s ({r['checkpoint_bytes'] / 2**20:.1f} MiB) |"
        for r in runs
    ]
    table = "\n".join(
        [
            HOSTS_START,
            f'Two trainer ranks, one host against two "hosts" on loopback ({machine}, {result["date"]}; '
            f"GRPO steps on 8 x 8 synthetic answers, median of {steps}; each rank on half the cores):",
            "",
            "| ranks | start (rendezvous, both trainers built) | step | summing gradients (bytes a step) | checkpoint to every rank |",
            "| --- | --- | --- | --- | --- |",
            *rows,
            "",
            f'Two inference replicas, one host against one replica joined from another "host" on loopback '
            f"({requests} distinct chats of {TOKENS} tokens at concurrency {CONCURRENCY}; each replica on half the "
            "cores; the swap loads a checkpoint into both, median of 5; the other host's adapter travels over HTTP):",
            "",
            "| replicas | sampled tokens/s | requests per replica | swap | adapter pushed (bytes) | joined in |",
            "| --- | --- | --- | --- | --- | --- |",
            *map(_replica_row, replica_runs),
            HOSTS_END,
        ]
    )
    replace_section(HOSTS_START, HOSTS_END, table)
    print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=128)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--hosts", action="store_true", help="only one host against two hosts on loopback")
    args = parser.parse_args()
    if args.hosts:
        compare_hosts(args.steps, args.requests)
        return
    runs = [asyncio.run(measure(replicas, args.requests)) for replicas in (1, 2)]
    rank_runs = [measure_ranks(setup, args.steps) for setup in RANK_SETUPS]
    result = {
        "machine": machine_label(),
        "date": datetime.date.today().isoformat(),
        "runs": runs,
        "rank_runs": rank_runs,
    }
    write_json_atomic(SCALE_RESULTS, result)
    one = runs[0]["tokens_per_s"]
    rows = [
        f"| {r['replicas']} | {r['tokens_per_s']:.0f} ({r['tokens_per_s'] / one:.2f}x) | "
        f"{' / '.join(map(str, r['requests_per_replica']))} | {r['swap_s_median'] * 1000:.0f} ms | {r['start_s']:.0f} s |"
        for r in runs
    ]
    single = rank_runs[0]["step_s_median"]
    summing = [f"{r['allreduce_s_median'] * 1000:.0f} ms" if r["ranks"] > 1 else "-" for r in rank_runs]
    rank_rows = [
        f"| {r['setup']} | {r['step_s_median']:.1f} s ({single / r['step_s_median']:.2f}x) | "
        f"{r['trained_tokens_per_s']:.0f} | {summed} | "
        f"{' / '.join(f'{g * 1024:.0f}' for g in r['weights_gib_per_rank'])} MiB | {r['start_s']:.0f} s |"
        for r, summed in zip(rank_runs, summing, strict=True)
    ]
    table = "\n".join(
        [
            START,
            f"Inference replicas, packaged model, {args.requests} distinct chats of {TOKENS} tokens at concurrency "
            f"{CONCURRENCY} through the gateway, {result['machine']}, {result['date']}:",
            "",
            "| replicas | sampled tokens/s | requests per replica | swap (load into every replica) | start |",
            "| --- | --- | --- | --- | --- |",
            *rows,
            "",
            f"Trainer ranks (no server), a GRPO step on 8 x 8 synthetic answers "
            f"(~{rank_runs[0]['tokens_per_step']:.0f} tokens), median of {args.steps} steps:",
            "",
            "| trainer | step | tokens/s | summing gradients | weights per rank | start |",
            "| --- | --- | --- | --- | --- | --- |",
            *rank_rows,
            END,
        ]
    )
    replace_section(START, END, table)
    print(table)


if __name__ == "__main__":
    main()
