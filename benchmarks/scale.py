"""One vs two inference replicas on this machine: sampled tokens/s through the gateway and swap time.

    .venv/bin/python -m benchmarks.scale [--requests 128]

For each replica count, a fresh LocalBackend serves the packaged model (`ServerConfig(replicas=N)`);
the same distinct-prompt chat completions (64 tokens each, greedy, `ignore_eos`) go through the
gateway at concurrency 32 to the model's adapter, after a warm-up; the swap is the time to load a
checkpoint into every replica (what a step's swap waits for), median of 5. On two cores, two
replicas get one core each: the figures show what coordination costs, not a speed-up. Writes
benchmarks/results/scale.json and the README table.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import statistics
import tempfile
import time
from typing import Any

import httpx

import agentrl
from agentrl.files import write_json_atomic
from benchmarks.gateway import timed_completions
from benchmarks.readme import replace_section
from benchmarks.step_breakdown import RESULTS, cpu_name

SCALE_RESULTS = RESULTS.with_name("scale.json")
START, END = "<!-- benchmark:scale:start -->", "<!-- benchmark:scale:end -->"
CONCURRENCY, TOKENS = 32, 64


async def measure(replicas: int, requests: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        model = agentrl.TrainableModel(
            name="scale", project="scale", base_path=tmp, server=agentrl.ServerConfig(replicas=replicas)
        )
        backend = agentrl.LocalBackend()
        try:
            started = time.perf_counter()
            await model.register(backend)
            start_s = time.perf_counter() - started
            async with httpx.AsyncClient(timeout=600) as client:
                url, name = backend.base_url, model.inference_name
                await timed_completions(client, url, name, CONCURRENCY, CONCURRENCY, distinct_prompts=True)  # warm-up
                before = [r.sent for r in backend.gateway.upstream.replicas]
                _, tokens, wall_s = await timed_completions(
                    client, url, name, requests, CONCURRENCY, distinct_prompts=True, max_tokens=TOKENS
                )
                sent = [r.sent - b for r, b in zip(backend.gateway.upstream.replicas, before)]
            checkpoint = backend.session(model).store.path(0)
            swaps = []
            for index in range(5):
                swap_started = time.perf_counter()
                await backend.server.load_adapter(f"swap-{index}@0", checkpoint)
                swaps.append(time.perf_counter() - swap_started)
                await backend.server.unload_adapter(f"swap-{index}@0")
        finally:
            await backend.close()
    result = {
        "replicas": replicas,
        "start_s": start_s,
        "requests": requests,
        "tokens_per_s": tokens / wall_s,
        "requests_per_replica": sent,
        "swap_s_median": statistics.median(swaps),
    }
    print(result, flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=128)
    args = parser.parse_args()
    runs = [asyncio.run(measure(replicas, args.requests)) for replicas in (1, 2)]
    result = {
        "machine": f"{cpu_name()}, {os.cpu_count()} cores",
        "date": datetime.date.today().isoformat(),
        "runs": runs,
    }
    write_json_atomic(SCALE_RESULTS, result)
    one = runs[0]["tokens_per_s"]
    rows = [
        f"| {r['replicas']} | {r['tokens_per_s']:.0f} ({r['tokens_per_s'] / one:.2f}x) | "
        f"{' / '.join(map(str, r['requests_per_replica']))} | {r['swap_s_median'] * 1000:.0f} ms | {r['start_s']:.0f} s |"
        for r in runs
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
            END,
        ]
    )
    replace_section(START, END, table)
    print(table)


if __name__ == "__main__":
    main()
