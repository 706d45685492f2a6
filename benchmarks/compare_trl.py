"""TRL's GRPOTrainer on the same model, task and sizes, timed per step, against agentrl's measured step.

    .venv/bin/pip install -c .venv/agentrl-constraints.txt -e ".[bench]"
    .venv/bin/python -m benchmarks.step_breakdown && .venv/bin/python -m benchmarks.compare_trl

Same base model (the packaged SmolLM2-135M-Instruct), LoRA rank 8 on all projections, 8 prompts x
8 generations a step, at most 16 new tokens, temperature 1, learning rate 5e-4, clip (0.2, 0.28),
no KL, bf16. TRL generates with transformers' `generate` (its vLLM mode needs a GPU server), which
is what a TRL user gets on a CPU. Writes benchmarks/results/compare_trl.json and the README table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import tempfile
import time

from agentrl.base_models import resolve_base_model
from agentrl.files import write_json_atomic
from benchmarks.readme import replace_section
from benchmarks.step_breakdown import RESULTS, cpu_name
from environments.larger_number.task import Scenario, reward, scenarios

TRL_RESULTS = RESULTS.with_name("compare_trl.json")
START, END = "<!-- benchmark:compare_trl:start -->", "<!-- benchmark:compare_trl:end -->"


def run_trl(steps: int, prompts_per_step: int, group_size: int) -> list[float]:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    train = scenarios("train", steps * prompts_per_step, seed=3)
    dataset = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": s.prompt}], "a": s.a, "b": s.b} for s in train]
    )

    def larger_number_reward(completions, a, b, **kwargs):
        return [reward(c[0]["content"], Scenario(x, y)) for c, x, y in zip(completions, a, b)]

    step_seconds: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            step_seconds.append(time.perf_counter() - self.started)
            print(f"TRL step {len(step_seconds)}: {step_seconds[-1]:.1f} s", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        config = GRPOConfig(
            output_dir=tmp,
            max_steps=steps,
            per_device_train_batch_size=prompts_per_step * group_size,
            num_generations=group_size,
            max_completion_length=16,
            temperature=1.0,
            learning_rate=5e-4,
            epsilon=0.2,
            epsilon_high=0.28,
            beta=0.0,
            bf16=True,
            use_cpu=True,
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            shuffle_dataset=False,
        )
        lora = LoraConfig(
            r=8,
            lora_alpha=16,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
            task_type="CAUSAL_LM",
        )
        trainer = GRPOTrainer(
            model=resolve_base_model("smollm2-135m-instruct"),
            reward_funcs=larger_number_reward,
            args=config,
            train_dataset=dataset,
            peft_config=lora,
            callbacks=[StepTimer()],
        )
        trainer.train()
    return step_seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    if not RESULTS.exists():
        raise SystemExit(f"run `python -m benchmarks.step_breakdown` first: {RESULTS} is missing")
    ours = json.loads(RESULTS.read_text())
    cfg = ours["config"]
    trl_steps = run_trl(args.steps, cfg["groups_per_step"], cfg["group_size"])
    trl_step_s = statistics.fmean(trl_steps[1:] or trl_steps)
    result = {
        "machine": f"{cpu_name()}, {os.cpu_count()} cores",
        "date": datetime.date.today().isoformat(),
        "config": cfg,
        "trl_step_s": trl_step_s,
        "trl_steps_s": trl_steps,
        "agentrl_step_s": ours["mean_over_steps"]["step_s"],
        "speedup": trl_step_s / ours["mean_over_steps"]["step_s"],
    }
    write_json_atomic(TRL_RESULTS, result)
    table = "\n".join(
        [
            START,
            f"TRL {__import__('trl').__version__} `GRPOTrainer` vs agentrl, same model, task and sizes, on {result['machine']}, {result['date']}:",
            "",
            "| | seconds per step |",
            "|---|---|",
            f"| TRL GRPOTrainer (transformers generate) | {trl_step_s:.1f} |",
            f"| agentrl (vLLM + peft) | {result['agentrl_step_s']:.1f} |",
            f"| **agentrl speed-up** | **{result['speedup']:.1f}x** |",
            END,
        ]
    )
    replace_section(START, END, table)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
