"""Sampling on this machine's vLLM server: the base model vs the current adapter, and the first completion.

    .venv/bin/python -m benchmarks.sampling [--label default] [--vllm-arg=--max-num-seqs=16 ...]

One LocalBackend serves the packaged model and a freshly registered model's adapter (its LoRA B is
zero at step 0, but vLLM runs the LoRA kernels all the same). Measured through the gateway:
- tokens/s at concurrency 32 and 64: 128 distinct chats, 64 tokens each (greedy, `ignore_eos`),
  to "base" and to the adapter back to back, in 3 rounds after a warm-up: the medians of the rates
  and of the rounds' adapter/base ratios;
- the rollout phase's start: the main job's burst (64 requests at once: 8 prompts x 8, at most 16
  new tokens, temperature 1) to the adapter; seconds to the first finished completion and to the
  last, median of 3 bursts; and once on the fresh server, before any other request, as the main
  job's first step meets it.
`--vllm-arg` passes a flag to the server (ServerConfig.extra_args), to compare scheduler settings;
`AGENTRL_VLLM_GROUPED_LORA=0` in the environment measures vLLM's own CPU LoRA ops instead of
agentrl_vllm's grouped ones.
Each run adds a row under its `--label` to benchmarks/results/sampling.json and rewrites its table in the docs.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import statistics
import tempfile
import time
from typing import Any

import httpx

import agentrl
from agentrl.foundation.files import write_json_atomic
from agentrl_environments.larger_number.task import scenarios
from benchmarks.gateway import timed_completions
from benchmarks.readme import replace_section
from benchmarks.step_breakdown import RESULTS, machine_label

SAMPLING_RESULTS = RESULTS.with_name("sampling.json")
START, END = "<!-- benchmark:sampling:start -->", "<!-- benchmark:sampling:end -->"
REQUESTS, TOKENS = 128, 64
ROUNDS = 3  # per concurrency; one round's ratio moved by up to 20 points between runs on a 2-core EPYC


async def burst(client: httpx.AsyncClient, url: str, name: str, seed: int) -> tuple[float, float]:
    """The main job's rollout burst: (seconds to the first finished completion, to the last)."""
    prompts = [s.prompt for s in scenarios("train", 8, seed=seed) for _ in range(8)]
    started = time.perf_counter()
    finished: list[float] = []

    async def one(prompt: str) -> None:
        body = {
            "model": name,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 16,
            "temperature": 1.0,
            "logprobs": True,
            "return_token_ids": True,
        }
        response = await client.post(f"{url}/chat/completions", json=body)
        response.raise_for_status()
        finished.append(time.perf_counter() - started)

    await asyncio.gather(*(one(p) for p in prompts))
    return min(finished), max(finished)


async def measure(vllm_args: list[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        model = agentrl.TrainableModel(
            name="sampling", project="bench", base_path=tmp, server=agentrl.ServerConfig(extra_args=tuple(vllm_args))
        )
        backend = agentrl.LocalBackend()
        try:
            await model.register(backend)
            url = backend.base_url
            headers = {"Authorization": f"Bearer {backend.base_model()._key() or ''}"}
            names = {"base": "base", "adapter": model.inference_name}
            result: dict[str, Any] = {}
            async with httpx.AsyncClient(timeout=600, headers=headers) as client:
                result["fresh_first_completion_s"], result["fresh_last_completion_s"] = await burst(
                    client, url, names["adapter"], seed=100
                )
                for name in names.values():  # warm-up
                    await timed_completions(client, url, name, 32, 32, distinct_prompts=True, max_tokens=8)
                for concurrency in (32, 64):
                    rounds: dict[str, list[float]] = {which: [] for which in names}
                    for _ in range(ROUNDS):  # base and adapter back to back, so each pair shares the machine's state
                        for which, name in names.items():
                            _, tokens, wall_s = await timed_completions(
                                client, url, name, REQUESTS, concurrency, distinct_prompts=True, max_tokens=TOKENS
                            )
                            rounds[which].append(tokens / wall_s)
                            print(f"{which} at concurrency {concurrency}: {tokens / wall_s:.0f} tokens/s", flush=True)
                    for which, rates in rounds.items():
                        result[f"{which}_tok_per_s_c{concurrency}"] = statistics.median(rates)
                    result[f"adapter_vs_base_c{concurrency}"] = statistics.median(
                        adapter / base for adapter, base in zip(rounds["adapter"], rounds["base"], strict=True)
                    )
                    result[f"rounds_c{concurrency}"] = rounds
                result["rounds"] = ROUNDS
                bursts = [await burst(client, url, names["adapter"], seed) for seed in range(3)]
            result["first_completion_s"] = statistics.median(b[0] for b in bursts)
            result["last_completion_s"] = statistics.median(b[1] for b in bursts)
            result["bursts"] = bursts
        finally:
            await backend.close()
    return result


def fresh_burst(row: dict[str, Any]) -> str:
    """The fresh server's burst as a table cell; rows measured before it was timed show a dash."""
    if "fresh_first_completion_s" not in row:
        return "-"
    return f"{row['fresh_first_completion_s']:.1f} s / {row['fresh_last_completion_s']:.1f} s"


def readme_table(results: dict[str, dict[str, Any]]) -> str:
    """The docs section (markers included) that `results`, sampling.json's rows, make."""
    lines = [
        START,
        f"Sampling through the gateway, packaged model, {REQUESTS} chats of {TOKENS} tokens per figure; "
        "medians of the rounds' figures (base and adapter back to back in each round); "
        "burst = the main job's 64 rollouts at once (median of 3; and once on the fresh server, its first requests):",
        "",
        "| setting | LoRA ops | base tok/s c32 / c64 | adapter tok/s c32 / c64 | adapter / base | rounds "
        "| burst: first / last completion | fresh server's burst: first / last | measured |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label, row in results.items():
        lines.append(
            f"| {label}: {' '.join(row['vllm_args']) or 'default flags'} "
            f"| {'grouped (agentrl_vllm)' if row['grouped_lora'] else 'vLLM torch ops'} "
            f"| {row['base_tok_per_s_c32']:.0f} / {row['base_tok_per_s_c64']:.0f} "
            f"| {row['adapter_tok_per_s_c32']:.0f} / {row['adapter_tok_per_s_c64']:.0f} "
            f"| {row['adapter_vs_base_c32']:.0%} / {row['adapter_vs_base_c64']:.0%} | {row.get('rounds', 1)} "
            f"| {row['first_completion_s']:.1f} s / {row['last_completion_s']:.1f} s | {fresh_burst(row)} "
            f"| {row['machine']}, {row['date']} |"
        )
    return "\n".join([*lines, END])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--label", default="default")
    parser.add_argument("--vllm-arg", action="append", default=[], help="a vLLM server flag, e.g. --max-num-seqs=16")
    args = parser.parse_args()
    result = asyncio.run(measure(args.vllm_arg))
    grouped = os.environ.get("AGENTRL_VLLM_GROUPED_LORA", "1") == "1"
    result.update(
        vllm_args=args.vllm_arg, grouped_lora=grouped, machine=machine_label(), date=str(datetime.date.today())
    )
    results = json.loads(SAMPLING_RESULTS.read_text()) if SAMPLING_RESULTS.exists() else {}
    results[args.label] = result
    write_json_atomic(SAMPLING_RESULTS, results)
    print(json.dumps(result, indent=1))
    replace_section(START, END, readme_table(results))


if __name__ == "__main__":
    main()
