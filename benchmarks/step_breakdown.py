"""Step-time breakdown and throughput of the closed loop on this machine.

    .venv/bin/python -m benchmarks.step_breakdown [--steps 5]

Runs the main job's task (larger_number, 8 groups x 8 rollouts a step) and measures, per step:
rollouts (wall), tokenize, train, save and adapter-swap seconds; sampled tokens per second
(completion tokens / rollout wall time); trained tokens per second (all tokens through forward and
backward / train time); peak RSS of the trainer process and of the vLLM server processes.
Writes benchmarks/results/step_breakdown.json and the table between its markers in the docs.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

import agentrl
from agentrl.foundation.files import write_json_atomic
from agentrl_environments.larger_number.task import rollout, scenarios
from benchmarks.readme import replace_section

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "step_breakdown.json"
START, END = "<!-- benchmark:step_breakdown:start -->", "<!-- benchmark:step_breakdown:end -->"
AVX2_ONLY_ENV = "AGENTRL_AVX2_ONLY"
"""Set by scripts/avx2_only.sh, whose runs are float32 code paths on a CPU that has bf16."""


def cpu_name() -> str:
    """The CPU's model name, as results name it; under scripts/avx2_only.sh it says so, since those times are a
    bf16 CPU's with AVX2 caps, not a float32 machine's."""
    name = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor() or "unknown",
    )
    return f"{name} under scripts/avx2_only.sh (AVX2 caps)" if os.environ.get(AVX2_ONLY_ENV) == "1" else name


def precision_label() -> str:
    """The number format agentrl trains and samples in on this machine: bf16 where it is native, else float32."""
    from agentrl.backend.precision import cpu_has_native_bf16

    return "bf16" if cpu_has_native_bf16() else "float32"


def machine_label() -> str:
    """This machine as results tables name it: its kind (the number format agentrl computes in, bf16 or float32,
    which sets its speed), CPU and cores."""
    return f"{precision_label()}: {cpu_name()}, {os.cpu_count()} cores"


def peak_rss_gib(pid: int) -> float:
    """Peak resident memory (VmHWM) of a process and its children, in GiB."""
    total_kib = 0
    for proc in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
        for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                total_kib += int(line.split()[1])
    return total_kib / 2**20


async def run(steps: int, groups_per_step: int, group_size: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        model = agentrl.TrainableModel(name="bench", project="bench", base_path=tmp)
        backend = agentrl.LocalBackend()
        try:
            started = time.perf_counter()
            await model.register(backend)
            register_s = time.perf_counter() - started
            train = scenarios("train", steps * groups_per_step, seed=3)
            rows = []
            for step in range(steps):
                started = time.perf_counter()
                groups = await agentrl.gather_trajectory_groups(
                    (
                        agentrl.TrajectoryGroup(rollout(model, s) for _ in range(group_size))
                        for s in train[step * groups_per_step : (step + 1) * groups_per_step]
                    ),
                    desc=f"step {step + 1} rollouts",
                )
                rollout_s = time.perf_counter() - started
                sampled = sum(t.metrics["completion_tokens"] for g in groups for t in g.trajectories)
                result = await model.train(groups, agentrl.TrainConfig(learning_rate=5e-4))
                m = result.metrics
                rows.append(
                    {
                        "step": step + 1,
                        "skipped": result.skipped,
                        "rollout_s": rollout_s,
                        "sampled_tokens": sampled,
                        "tokenize_s": m.get("tokenize_s", 0.0),
                        "train_s": m.get("train_s", 0.0),
                        "save_s": m.get("save_s", 0.0),
                        "swap_s": m.get("swap_s", 0.0),
                        "total_tokens": m.get("total_tokens", 0.0),
                        "forward_tokens": m.get("forward_tokens", m.get("total_tokens", 0.0)),
                        "trained_tokens": m.get("trained_tokens", 0.0),
                        "step_s": time.perf_counter() - started,
                    }
                )
                print(json.dumps(rows[-1]))
            trainer_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
            server_peak = peak_rss_gib(backend.server.replicas[0].process.pid)
        finally:
            await backend.close()
    measured = [r for r in rows[1:] if not r["skipped"]] or rows  # step 1 warms up kernels; report it apart

    def mean(key: str) -> float:
        return statistics.fmean(r[key] for r in measured)

    return {
        "machine": f"{cpu_name()}, {os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB",
        "precision": precision_label(),
        "date": datetime.date.today().isoformat(),
        "config": {"steps": steps, "groups_per_step": groups_per_step, "group_size": group_size, "max_tokens": 16},
        "register_s": register_s,
        "first_step_s": rows[0]["step_s"],
        "mean_over_steps": {k: mean(k) for k in ("step_s", "rollout_s", "tokenize_s", "train_s", "save_s", "swap_s")},
        "sampled_tok_per_s": sum(r["sampled_tokens"] for r in measured) / sum(r["rollout_s"] for r in measured),
        "trained_tok_per_s": sum(r["total_tokens"] for r in measured) / max(sum(r["train_s"] for r in measured), 1e-9),
        "loss_tok_per_s": sum(r["trained_tokens"] for r in measured) / max(sum(r["train_s"] for r in measured), 1e-9),
        "peak_rss_gib": {"trainer_process": trainer_peak, "vllm_server": server_peak},
        "steps": rows,
    }


def readme_table(results: dict[str, dict]) -> str:
    """One row per number format and machine."""
    lines = [
        START,
        "Measured by `benchmarks/step_breakdown.py` (8 groups x 8 rollouts per step, max 16 new tokens; means over "
        "steps 2-5; trained tok/s counts every token of the sequences, as if unshared):",
        "",
        "| machine | step | rollouts | tokenize | train | save | adapter swap | sampled tok/s | "
        "trained tok/s (all / loss) | tokens computed | peak RSS trainer / vLLM |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for result in results.values():
        means = result["mean_over_steps"]
        measured = [r for r in result["steps"][1:] if not r["skipped"]] or result["steps"]
        recorded = all("forward_tokens" in r for r in measured)  # not before shared-prefix packing existed
        computed = sum(r.get("forward_tokens", 0) for r in measured) / max(sum(r["total_tokens"] for r in measured), 1)
        lines.append(
            f"| {machine_key(result)}, {result['date']} | {means['step_s']:.1f} s | {means['rollout_s']:.1f} s "
            f"| {means['tokenize_s']:.2f} s | {means['train_s']:.1f} s | {means['save_s']:.2f} s | {means['swap_s']:.2f} s "
            f"| {result['sampled_tok_per_s']:.0f} | {result['trained_tok_per_s']:.0f} / {result['loss_tok_per_s']:.0f} "
            f"| {f'{computed:.0%}' if recorded else 'not recorded'} | {result['peak_rss_gib']['trainer_process']:.1f} / "
            f"{result['peak_rss_gib']['vllm_server']:.1f} GiB |"
        )
    return "\n".join([*lines, END])


def machine_key(result: dict[str, Any]) -> str:
    """A result's key in a results file: its number format and machine, so each kind of CPU keeps its own row."""
    return f"{result['precision']}: {result['machine']}"


def load_results_by_machine(path: Path, single_result_field: str) -> dict[str, dict]:
    """A benchmark's results keyed by `machine_key`. Older files held one result (it has
    `single_result_field`) or were keyed by number format alone; both are read into the new keys."""
    if not path.exists():
        return {}
    saved = json.loads(path.read_text())
    if single_result_field in saved:
        saved = {"bf16": {"precision": "bf16", **saved}}
    return {machine_key({"precision": key, **result}): result for key, result in saved.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--groups-per-step", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    args = parser.parse_args()
    results = load_results_by_machine(RESULTS, "steps")
    result = asyncio.run(run(args.steps, args.groups_per_step, args.group_size))
    results[machine_key(result)] = result
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(RESULTS, results)
    replace_section(START, END, readme_table(results))
    print(f"wrote {RESULTS} and its table in the docs")


if __name__ == "__main__":
    main()
