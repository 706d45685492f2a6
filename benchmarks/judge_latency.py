"""RULER judge-call latency against the local vLLM server (the packaged model as judge).

    .venv/bin/python -m benchmarks.judge_latency

Groups of 4 and 8 real completions (the larger-number task), each judged `--repeats` times, one
call at a time. Writes benchmarks/results/judge_latency.json and its table in the docs.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import statistics
import tempfile

import agentrl
from agentrl.files import write_json_atomic
from agentrl.judges import JudgeLimiter, ruler_score_group
from agentrl_environments.larger_number.task import rollout, scenarios
from benchmarks.readme import replace_section
from benchmarks.step_breakdown import RESULTS, machine_label

LATENCY_RESULTS = RESULTS.with_name("judge_latency.json")
START, END = "<!-- benchmark:judge_latency:start -->", "<!-- benchmark:judge_latency:end -->"


async def measure(repeats: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        model = agentrl.TrainableModel(name="judge-bench", project="bench", base_path=tmp)
        backend = agentrl.LocalBackend()
        try:
            await model.register(backend)
            results = {}
            for size in (4, 8):
                (group,) = await agentrl.gather_trajectory_groups(
                    [agentrl.TrajectoryGroup(rollout(model, s) for s in scenarios("test", size, seed=size))],
                    show_progress=False,
                )
                limiter = JudgeLimiter()
                for _ in range(repeats):
                    await ruler_score_group(group, model, limiter=limiter, extra_litellm_params={"max_tokens": 600})
                results[size] = {
                    "mean_s": statistics.fmean(limiter.latencies_s),
                    "min_s": min(limiter.latencies_s),
                    "max_s": max(limiter.latencies_s),
                    "attempts_per_call": limiter.attempts / limiter.calls,
                    "failures": limiter.failures,
                }
                print(size, results[size])
        finally:
            await backend.close()
    return {
        "machine": machine_label(),
        "date": datetime.date.today().isoformat(),
        "repeats": repeats,
        "groups": results,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    result = asyncio.run(measure(args.repeats))
    write_json_atomic(LATENCY_RESULTS, result)
    rows = [
        f"| {size} | {r['mean_s']:.2f} s | {r['min_s']:.2f}-{r['max_s']:.2f} s | {r['attempts_per_call']:.2f} |"
        for size, r in result["groups"].items()
    ]
    table = "\n".join(
        [
            START,
            f"RULER latency, packaged model judging on the local vLLM server, {result['machine']}, {result['date']} "
            f"({result['repeats']} calls per size, one at a time):",
            "",
            "| group size | mean | range | attempts per call |",
            "|---|---|---|---|",
            *rows,
            END,
        ]
    )
    replace_section(START, END, table)


if __name__ == "__main__":
    main()
