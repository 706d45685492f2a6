"""TRL's GRPOTrainer and agentrl side by side in one run: the same GRPO step timed alternately.

    .venv/bin/pip install -c .venv/agentrl-constraints.txt -e ".[bench]"
    .venv/bin/python -m benchmarks.compare_trl [--reps 3] [--steps 3]

Same base model (the packaged SmolLM2-135M-Instruct), task (larger_number), LoRA rank 8 / alpha 16
on all projections, 8 prompts x 8 generations a step, at most 16 new tokens, temperature 1,
learning rate 5e-4, PPO clip (0.2, 0.28), no KL, and the same number format for both: bf16 on a CPU
with native bf16, float32 on one without (where agentrl computes in float32, `precision`; TRL
asked for bf16 there gets emulated bf16, 15-20x slower, a ratio that compares number formats and
not frameworks). A step is everything between two updates:
sampling the 64 answers, rewards, training, and (agentrl) saving the adapter and swapping it in.

Each repetition times `--steps` steps of each, after one warm-up step, and the order alternates
(agentrl first in even repetitions, TRL first in odd ones) so drift in the machine's speed hits
both. TRL runs in a fresh process per repetition (its `train()` runs a fixed number of steps);
agentrl keeps one backend (its server start, ~30 s, is reported apart, not in the step) and, like
TRL, trains a fresh model in each repetition after one warm-up step, so both time the same steps of
training (a run that trained on learns shorter answers, which sample and train faster). While TRL runs, agentrl's idle server holds memory but no CPU.

TRL's settings for a CPU: weights in that format (with peft's fp32 adapters as TRL makes them), all 64 generations in one `generate` batch and one training batch (no gradient
accumulation), no gradient checkpointing, the same 2 threads, SDPA attention (transformers'
default). Its vLLM modes need a GPU, so `generate` is what a TRL user gets on a CPU. Not tried:
other attention kernels or `torch.compile` for TRL. Writes benchmarks/results/compare_trl.json (one
result per number format) and the tables in the docs.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agentrl.backend.precision import cpu_has_native_bf16
from agentrl.foundation.base_models import resolve_base_model
from agentrl.foundation.files import write_json_atomic
from agentrl_environments.larger_number.task import Scenario, reward, rollout, scenarios
from benchmarks.readme import replace_section
from benchmarks.step_breakdown import cpu_name, load_results_by_machine, machine_key, precision_label

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "compare_trl.json"
START, END = "<!-- benchmark:compare_trl:start -->", "<!-- benchmark:compare_trl:end -->"
PROMPTS, GROUP_SIZE, MAX_TOKENS, LEARNING_RATE = 8, 8, 16, 5e-4


def run_trl(steps: int, seed: int) -> list[float]:
    """Seconds of each of `steps` TRL GRPO steps (in this process)."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    train = scenarios("train", steps * PROMPTS, seed=seed)
    dataset = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": s.prompt}], "a": s.a, "b": s.b} for s in train]
    )

    def larger_number_reward(completions, a, b, **kwargs):
        return [reward(c[0]["content"], Scenario(x, y)) for c, x, y in zip(completions, a, b, strict=True)]

    step_seconds: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            step_seconds.append(time.perf_counter() - self.started)
            print(f"TRL step {len(step_seconds)}: {step_seconds[-1]:.1f} s", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        config = GRPOConfig(
            output_dir=tmp,
            max_steps=steps,
            per_device_train_batch_size=PROMPTS * GROUP_SIZE,
            num_generations=GROUP_SIZE,
            max_completion_length=MAX_TOKENS,
            temperature=1.0,
            learning_rate=LEARNING_RATE,
            epsilon=0.2,
            epsilon_high=0.28,
            beta=0.0,
            bf16=cpu_has_native_bf16(),  # the format agentrl trains in on this machine (see the docstring)
            model_init_kwargs={"dtype": torch.bfloat16 if cpu_has_native_bf16() else torch.float32},
            use_cpu=True,
            gradient_checkpointing=False,
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            shuffle_dataset=False,
            dataloader_num_workers=0,
        )
        lora = LoraConfig(
            r=8,
            lora_alpha=16,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
            task_type="CAUSAL_LM",
        )
        GRPOTrainer(
            model=resolve_base_model("smollm2-135m-instruct"),
            reward_funcs=larger_number_reward,
            args=config,
            train_dataset=dataset,
            peft_config=lora,
            callbacks=[StepTimer()],
        ).train()
    return step_seconds


def trl_in_a_process(steps: int, seed: int) -> list[float]:
    """`run_trl` in a fresh interpreter; its last stdout line is the step times as JSON."""
    command = [sys.executable, "-m", "benchmarks.compare_trl", "--trl-only", "--steps", str(steps), "--seed", str(seed)]
    done = subprocess.run(command, cwd=ROOT, stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


async def agentrl_steps(model: Any, steps: int, seed: int) -> list[float]:
    """Seconds of each of `steps` agentrl steps: gather 8 x 8 rollouts, then `model.train`."""
    import agentrl

    train = scenarios("train", steps * PROMPTS, seed=seed)
    seconds = []
    for step in range(steps):
        started = time.perf_counter()
        groups = await agentrl.gather_trajectory_groups(
            (
                agentrl.TrajectoryGroup(rollout(model, s) for _ in range(GROUP_SIZE))
                for s in train[step * PROMPTS : (step + 1) * PROMPTS]
            ),
            show_progress=False,
        )
        await model.train(groups, agentrl.TrainConfig(learning_rate=LEARNING_RATE))
        seconds.append(time.perf_counter() - started)
        print(f"agentrl step: {seconds[-1]:.1f} s", file=sys.stderr, flush=True)
    return seconds


async def side_by_side(reps: int, steps: int) -> dict[str, Any]:
    import agentrl

    with tempfile.TemporaryDirectory() as tmp:
        backend = agentrl.LocalBackend()
        try:
            start_s = None  # the first registration starts the server
            rows = []
            for rep in range(reps):
                order = ["agentrl", "trl"] if rep % 2 == 0 else ["trl", "agentrl"]
                row: dict[str, Any] = {"rep": rep + 1, "order": order}
                for system in order:
                    if system == "agentrl":  # a fresh model each repetition, as TRL's fresh process: the same
                        # point of training (a policy that has learned answers shorter, and so faster)
                        model = agentrl.TrainableModel(name=f"compare-{rep}", project="bench", base_path=tmp)
                        started = time.perf_counter()
                        await model.register(backend)
                        start_s = start_s if start_s is not None else time.perf_counter() - started
                        await agentrl_steps(model, 1, seed=100)  # warm-up, as TRL's first step
                        row["agentrl_steps_s"] = await agentrl_steps(model, steps, seed=rep)
                    else:  # the first step warms up TRL's process
                        row["trl_steps_s"] = (await asyncio.to_thread(trl_in_a_process, steps + 1, rep))[1:]
                row["trl_step_s"] = statistics.fmean(row["trl_steps_s"])
                row["agentrl_step_s"] = statistics.fmean(row["agentrl_steps_s"])
                row["speedup"] = row["trl_step_s"] / row["agentrl_step_s"]
                print(json.dumps(row), file=sys.stderr, flush=True)
                rows.append(row)
        finally:
            await backend.close()
    speedups = [r["speedup"] for r in rows]
    return {
        "machine": f"{cpu_name()}, {os.cpu_count()} cores",
        "precision": precision_label(),
        "date": datetime.date.today().isoformat(),
        "config": {"prompts": PROMPTS, "group_size": GROUP_SIZE, "max_tokens": MAX_TOKENS, "steps_per_rep": steps},
        "trl_version": __import__("trl").__version__,
        "agentrl_server_start_s": start_s,
        "reps": rows,
        "trl_step_s": statistics.median(r["trl_step_s"] for r in rows),
        "agentrl_step_s": statistics.median(r["agentrl_step_s"] for r in rows),
        "speedup_median": statistics.median(speedups),
        "speedup_range": [min(speedups), max(speedups)],
    }


def readme_table(results: dict[str, Any]) -> str:
    """One table per number format and machine."""
    lines = [START]
    for result in results.values():
        format_name = result["precision"]
        low, high = result["speedup_range"]
        lines += [
            f"**{format_name}** (both frameworks): TRL {result['trl_version']} `GRPOTrainer` and agentrl timed "
            f"alternately in one run ({len(result['reps'])} repetitions x {result['config']['steps_per_rep']} steps "
            f"each, after warm-up), same model, task and sizes, {result['machine']}, {result['date']}:",
            "",
            "| repetition | order | TRL s/step | agentrl s/step | agentrl speed-up |",
            "| --- | --- | --- | --- | --- |",
        ]
        for row in result["reps"]:
            lines.append(
                f"| {row['rep']} | {' then '.join(row['order'])} | {row['trl_step_s']:.1f} | "
                f"{row['agentrl_step_s']:.1f} | {row['speedup']:.2f}x |"
            )
        lines += [
            f"| **median** | | **{result['trl_step_s']:.1f}** | **{result['agentrl_step_s']:.1f}** "
            f"| **{result['speedup_median']:.2f}x** (range {low:.2f}-{high:.2f}x) |",
            "",
        ]
    return "\n".join([*lines[:-1], END])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per system per repetition")
    parser.add_argument("--trl-only", action="store_true", help=argparse.SUPPRESS)  # the TRL child process
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trl_only:
        print(json.dumps(run_trl(args.steps, args.seed)))
        return
    results = load_results_by_machine(RESULTS, "reps")
    result = asyncio.run(side_by_side(args.reps, args.steps))
    results[machine_key(result)] = result
    write_json_atomic(RESULTS, results)
    replace_section(START, END, readme_table(results))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
