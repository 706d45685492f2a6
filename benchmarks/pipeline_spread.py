"""The table of `python -m benchmarks.pipeline --spread`: held-out reward per loop and loss setting. Apart from
benchmarks/pipeline.py, which bounds OpenMP's spin when imported, so the table renders without that side effect."""

from __future__ import annotations

from typing import Any

SPREAD_START, SPREAD_END = "<!-- benchmark:pipeline_spread:start -->", "<!-- benchmark:pipeline_spread:end -->"


def spread_table(results: dict[str, Any]) -> str:
    """The `--spread` runs' held-out reward, a line per loop and loss setting, between its markers."""
    lines = [
        SPREAD_START,
        f"{results['machine']}, {results.get('date', '')}; held-out reward over the test scenarios, one run per line:",
        "",
        "| loop and loss setting | steps | held-out reward |",
        "| --- | --- | --- |",
    ]
    for run in results["runs"]:
        rewards = {int(step): value for step, value in run["held_out_reward"].items()}
        lines.append(f"| {run['mode']} | {run['steps']} | {rewards[min(rewards)]:.3f} -> {rewards[max(rewards)]:.3f} |")
    return "\n".join([*lines, SPREAD_END])
