"""What the gateway costs: added latency per completion and sampled throughput, gateway vs direct.

    .venv/bin/python -m benchmarks.gateway

On one LocalBackend (the packaged model on vLLM), the same chat completions are sent straight to
vLLM and through the gateway, alternating, at concurrency 1 and 64. Added latency = the p50/p99
of the per-request difference at concurrency 1 (same prompt, greedy, so both sides do the same
work), for each API the gateway speaks: Chat Completions, Responses and Anthropic Messages (the
same conversation, translated to the same chat completion); throughput = sampled tokens/s at
concurrency 64. Writes benchmarks/results/gateway.json and its table in the docs.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import statistics
import tempfile
import time

import httpx

import agentrl
from agentrl.foundation.files import write_json_atomic
from benchmarks.readme import replace_section
from benchmarks.step_breakdown import RESULTS, machine_label

GATEWAY_RESULTS = RESULTS.with_name("gateway.json")
START, END = "<!-- benchmark:gateway:start -->", "<!-- benchmark:gateway:end -->"
MAX_TOKENS = 16


async def timed_completions(
    client: httpx.AsyncClient,
    url: str,
    name: str,
    count: int,
    concurrency: int,
    *,
    distinct_prompts: bool = False,
    max_tokens: int = MAX_TOKENS,
):
    """`count` completions, `concurrency` at a time: (per-request seconds, sampled tokens, wall seconds).
    `distinct_prompts` numbers each request's prompt, so they are separate conversations (spread over replicas)."""
    body = {
        "model": name,
        "messages": [{"role": "user", "content": "Count from one to twenty."}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "logprobs": True,
        "return_token_ids": True,
    }
    semaphore = asyncio.Semaphore(concurrency)
    latencies, tokens = [], 0

    async def one(index: int) -> None:
        nonlocal tokens
        request = body
        if distinct_prompts:
            request = {**body, "messages": [{"role": "user", "content": f"Count from {index} to {index + 20}."}]}
        async with semaphore:
            started = time.perf_counter()
            response = await client.post(f"{url}/chat/completions", json=request)
            latencies.append(time.perf_counter() - started)
            if response.status_code != 200:
                raise RuntimeError(f"request {index}: {response.status_code} {response.text[:2000]}")
            tokens += response.json()["usage"]["completion_tokens"]

    started = time.perf_counter()
    await asyncio.gather(*(one(index) for index in range(count)))
    return latencies, tokens, time.perf_counter() - started


PROMPT = "Count from one to twenty."
API_REQUESTS = {  # one greedy conversation in each API's words: path under /v1, body, tokens in the answer
    "chat": ("/chat/completions", {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": MAX_TOKENS},
             lambda answer: answer["usage"]["completion_tokens"]),
    "responses": ("/responses", {"input": PROMPT, "max_output_tokens": MAX_TOKENS},
                  lambda answer: answer["usage"]["output_tokens"]),
    "messages": ("/messages", {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": MAX_TOKENS},
                 lambda answer: answer["usage"]["output_tokens"]),
}  # fmt: skip


async def timed_api(client: httpx.AsyncClient, url: str, name: str, api: str) -> tuple[float, int]:
    """One greedy request in `api`'s format: (seconds, sampled tokens)."""
    path, body, tokens_of = API_REQUESTS[api]
    started = time.perf_counter()
    response = await client.post(f"{url}{path}", json={"model": name, "temperature": 0.0, **body})
    seconds = time.perf_counter() - started
    response.raise_for_status()
    return seconds, tokens_of(response.json())


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


async def measure(requests: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        model = agentrl.TrainableModel(name="gateway-bench", project="bench", base_path=tmp)
        backend = agentrl.LocalBackend()
        try:
            await model.register(backend)
            (server,), gateway = backend.server.replicas, backend.gateway
            direct = httpx.AsyncClient(timeout=600, headers={"Authorization": f"Bearer {server.api_key}"})
            through = httpx.AsyncClient(timeout=600, headers={"Authorization": f"Bearer {gateway.token}"})
            name = model.inference_name
            await timed_completions(direct, server.base_url, name, 4, 4)  # warm both paths
            await timed_completions(through, gateway.base_url, name, 4, 4)
            added: dict[str, list[float]] = {api: [] for api in API_REQUESTS}
            tokens: dict[str, list[int]] = {api: [] for api in API_REQUESTS}
            for _ in range(requests):  # concurrency 1, alternating, so drift hits both sides alike
                for api in API_REQUESTS:
                    direct_s, direct_tokens = await timed_api(direct, server.base_url, name, "chat")
                    gateway_s, gateway_tokens = await timed_api(through, gateway.base_url, name, api)
                    assert gateway_tokens == direct_tokens, f"{api}: the same greedy conversation, another length"
                    added[api].append((gateway_s - direct_s) * 1000)
                    tokens[api].append(gateway_tokens)
            results: dict = {
                f"added_ms_c1_{api}": {
                    "p50": percentile(added[api], 50),
                    "p99": percentile(added[api], 99),
                    "tokens": statistics.fmean(tokens[api]),
                }
                for api in API_REQUESTS
            }
            for concurrency in (64,):
                _, d_tokens, d_wall = await timed_completions(
                    direct, server.base_url, name, 4 * concurrency, concurrency
                )
                g_lat, g_tokens, g_wall = await timed_completions(
                    through, gateway.base_url, name, 4 * concurrency, concurrency
                )
                d_lat, _, _ = await timed_completions(direct, server.base_url, name, 4 * concurrency, concurrency)
                results[f"c{concurrency}"] = {
                    "direct_tokens_per_s": d_tokens / d_wall,
                    "gateway_tokens_per_s": g_tokens / g_wall,
                    "direct_p50_s": percentile(d_lat, 50),
                    "gateway_p50_s": percentile(g_lat, 50),
                    "gateway_p99_s": percentile(g_lat, 99),
                    "direct_p99_s": percentile(d_lat, 99),
                }
            await direct.aclose()
            await through.aclose()
        finally:
            await backend.close()
    return {
        "machine": machine_label(),
        "date": datetime.date.today().isoformat(),
        "requests_c1": requests,
        "max_tokens": MAX_TOKENS,
        "results": results,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=100, help="completions at concurrency 1, per side")
    args = parser.parse_args()
    result = asyncio.run(measure(args.requests))
    write_json_atomic(GATEWAY_RESULTS, result)
    r, c64 = result["results"], result["results"]["c64"]
    ratio = c64["gateway_tokens_per_s"] / c64["direct_tokens_per_s"]
    table = "\n".join(
        [
            START,
            f"Gateway overhead, packaged model on the local vLLM server, {result['machine']}, {result['date']} "
            f"({result['requests_c1']} alternating requests per API at concurrency 1, greedy, at most {MAX_TOKENS} "
            f"tokens each; 64 at a time for throughput):",
            "",
            "| what | direct to vLLM | through the gateway |",
            "| --- | --- | --- |",
            *[
                f"| added latency per {label}, concurrency 1 | - | p50 {r[key]['p50']:.2f} ms, p99 {r[key]['p99']:.2f} ms |"
                for label, key in (
                    ("chat completion", "added_ms_c1_chat"),
                    ("Responses request (`/v1/responses`)", "added_ms_c1_responses"),
                    ("Anthropic message (`/v1/messages`)", "added_ms_c1_messages"),
                )
            ],
            f"| latency, concurrency 64 (p50 / p99) | {c64['direct_p50_s']:.2f} / {c64['direct_p99_s']:.2f} s | "
            f"{c64['gateway_p50_s']:.2f} / {c64['gateway_p99_s']:.2f} s |",
            f"| sampled tokens/s, concurrency 64 | {c64['direct_tokens_per_s']:.0f} | "
            f"{c64['gateway_tokens_per_s']:.0f} ({ratio:.1%} of direct) |",
            END,
        ]
    )
    replace_section(START, END, table)
    print(table)


if __name__ == "__main__":
    main()
