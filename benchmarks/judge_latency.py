"""RULER's cost per group against the local vLLM server (the packaged model as judge), read both ways.

    .venv/bin/python -m benchmarks.judge_latency [--repeats 5]

Groups of 4 and 8 real completions (the larger-number task), each judged `--repeats` times, one group at a
time: as sampled JSON (one call, explanations and scores) and read from probabilities (every pair in both
orders, one token each, asked concurrently). Writes benchmarks/results/judge_latency.json and its table in the docs.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import statistics
import tempfile
from typing import Any

import agentrl
from agentrl.foundation.files import write_json_atomic
from agentrl.judges import JudgeLimiter
from agentrl.judges.readout import READOUTS
from agentrl.judges.ruler import ruler
from agentrl_environments.larger_number.task import rollout, scenarios
from benchmarks.readme import replace_section
from benchmarks.step_breakdown import RESULTS, machine_label

LATENCY_RESULTS = RESULTS.with_name("judge_latency.json")
START, END = "<!-- benchmark:judge_latency:start -->", "<!-- benchmark:judge_latency:end -->"


async def measure(repeats: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        model = agentrl.TrainableModel(name="judge-bench", project="bench", base_path=tmp)
        backend = agentrl.LocalBackend()
        try:
            await model.register(backend)
            rows = []
            for size in (4, 8):
                (group,) = await agentrl.gather_trajectory_groups(
                    [agentrl.TrajectoryGroup(rollout(model, s) for s in scenarios("test", size, seed=size))],
                    show_progress=False,
                )
                message_lists = [t.messages() for t in group.trajectories]
                for readout in READOUTS:
                    limiter = JudgeLimiter()
                    results = [
                        await ruler(
                            message_lists,
                            model,
                            limiter=limiter,
                            extra_litellm_params={"max_tokens": 600},
                            readout=readout,
                        )
                        for _ in range(repeats)
                    ]
                    latencies = [r.latency_s for r in results]
                    rows.append(
                        {
                            "size": size,
                            "readout": readout,
                            "mean_s": statistics.fmean(latencies),
                            "min_s": min(latencies),
                            "max_s": max(latencies),
                            "calls_per_group": limiter.calls / repeats,
                            "attempts_per_call": limiter.attempts / limiter.calls,
                            "tokens_per_group": statistics.fmean(
                                r.prompt_tokens + r.completion_tokens for r in results
                            ),
                            "failures": limiter.failures,
                        }
                    )
                    print(rows[-1], flush=True)
        finally:
            await backend.close()
    return {"machine": machine_label(), "date": datetime.date.today().isoformat(), "repeats": repeats, "rows": rows}


def table(result: dict[str, Any]) -> str:
    rows = [
        f"| {r['size']} | {r['readout']} | {r['mean_s']:.2f} s | {r['min_s']:.2f}-{r['max_s']:.2f} s | "
        f"{r['calls_per_group']:.0f} | {r['tokens_per_group']:.0f} | {r['attempts_per_call']:.2f} |"
        for r in result["rows"]
    ]
    return "\n".join(
        [
            f"RULER's cost per group, packaged model judging on the local vLLM server, {result['machine']}, "
            f"{result['date']} ({result['repeats']} groups per row, one at a time):",
            "",
            "| group size | readout | latency per group | range | calls per group | judge tokens per group | attempts per call |",
            "|---|---|---|---|---|---|---|",
            *rows,
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    result = asyncio.run(measure(args.repeats))
    write_json_atomic(LATENCY_RESULTS, result)
    replace_section(START, END, f"{START}\n{table(result)}\n{END}")


if __name__ == "__main__":
    main()
