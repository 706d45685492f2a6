"""Training throughput of one trainer (no server): trained tokens/s, model FLOP utilisation, profile.

    .venv/bin/python -m benchmarks.train_throughput [--steps 4] [--label after]

Times GRPO steps of the packaged model on 8 groups x 8 synthetic answers (the main job's shape:
a short prompt and answers of 3-30 words, about 3,600 tokens a step) after one warm-up step, and
profiles one more step with torch.profiler (top operators by self CPU time). Tokens/s counts every
token through forward and backward (prompt and answer) per second of `train_s`.

Model FLOP utilisation: useful FLOPs are 4 x decoder weights per token (forward, and the backward to
the activations; LoRA's weight gradients are negligible) plus 4 x head weights per loss position;
the peak is this machine's bf16 matmul rate at the decoder's shapes, measured in the same run.

Each run adds a row under its `--label` to benchmarks/results/train_throughput.json and rewrites the
docs table. `--tree` measures another checkout's trainer (the "before" row):
`git worktree add /tmp/before bfad497 && .venv/bin/python -m benchmarks.train_throughput --tree /tmp/before --label before`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "train_throughput.json"
START, END = "<!-- benchmark:train_throughput:start -->", "<!-- benchmark:train_throughput:end -->"


def matmul_peak(dtype: torch.dtype) -> float:
    """FLOP/s of a (4,096 x 576) @ (576 x 1,536) matmul in `dtype` (the trainer's: bf16, or float32 on
    a CPU without bf16), the decoder MLP's shape, best of 20."""
    a, b = torch.randn(4096, 576, dtype=dtype), torch.randn(576, 1536, dtype=dtype)
    for _ in range(3):
        a @ b
    best = min(_timed(lambda: a @ b) for _ in range(20))
    return 2 * 4096 * 576 * 1536 / best


def _timed(work: Any) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def weight_counts(causal_lm: Any) -> tuple[int, int]:
    """(decoder linear weights, output head weights) of a transformers CausalLM."""
    decoder = sum(m.weight.numel() for m in causal_lm.model.layers.modules() if isinstance(m, torch.nn.Linear))
    return decoder, causal_lm.lm_head.weight.numel()


def measure(steps: int) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    import agentrl

    try:
        from agentrl.backend.training.trainer import Trainer

        try:
            from agentrl.rl.micro_batches import default_micro_batch_tokens
        except ModuleNotFoundError:  # a `--tree` checkout from before rl/micro_batches.py
            from agentrl.backend.training.micro_batches import (  # type: ignore[import-not-found,no-redef]
                default_micro_batch_tokens,
            )
    except ModuleNotFoundError:  # a `--tree` checkout from before backend/training/ (and its default, or 4,096)
        from agentrl.backend import trainer as trainer_module  # type: ignore[attr-defined]

        Trainer = trainer_module.Trainer
        default_micro_batch_tokens = getattr(trainer_module, "default_micro_batch_tokens", lambda _: 4096)
    from agentrl.foundation.base_models import resolve_base_model
    from tests.helpers import synthetic_groups

    trainer = Trainer(resolve_base_model("smollm2-135m-instruct"), seed=0)
    trainer.add_adapter("bench", agentrl.LoRAConfig())
    decoder_weights, head_weights = weight_counts(trainer.model.get_base_model())
    config = agentrl.TrainConfig(learning_rate=1e-5)
    rows = []
    for step in range(steps + 1):
        metrics = trainer.train_step("bench", synthetic_groups(trainer.tokenizer, seed=step, size=8), config).metrics
        if step:  # step 0 warms up
            rows.append(metrics)
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        profiled = trainer.train_step("bench", synthetic_groups(trainer.tokenizer, seed=99, size=8), config).metrics
    total = sum(e.self_cpu_time_total for e in profiler.key_averages())
    top = sorted(profiler.key_averages(), key=lambda e: -e.self_cpu_time_total)[:10]
    tokens_per_s = [m["total_tokens"] / m["train_s"] for m in rows]
    # the work done: tokens computed (fewer than the sequences' tokens where shared prefixes are packed)
    computed = [m.get("forward_tokens", m["total_tokens"]) for m in rows]
    flops = [
        4 * decoder_weights * c + 4 * head_weights * m["trained_tokens"] for c, m in zip(computed, rows, strict=True)
    ]
    peak = matmul_peak(torch.bfloat16 if trainer.bf16 else torch.float32)
    achieved = statistics.median(f / m["train_s"] for f, m in zip(flops, rows, strict=True))
    return {
        "steps": len(rows),
        "tokens_per_step": statistics.mean(m["total_tokens"] for m in rows),
        "computed_tokens_per_step": statistics.mean(computed),
        "train_s": statistics.median(m["train_s"] for m in rows),
        "tokens_per_s": statistics.median(tokens_per_s),
        "tokens_per_s_range": [min(tokens_per_s), max(tokens_per_s)],
        "achieved_flops": achieved,
        "matmul_peak_flops": peak,
        "precision": "bf16" if trainer.bf16 else "float32",
        "mfu": achieved / peak,
        "micro_batch_tokens": config.micro_batch_tokens or default_micro_batch_tokens(trainer.device),
        "attention": trainer.model.get_base_model().config._attn_implementation,
        "profile_step_s": profiled["train_s"],
        "profile_top": [
            {"op": e.key, "self_s": e.self_cpu_time_total / 1e6, "share": e.self_cpu_time_total / total} for e in top
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--label", default="after", help="the row this run writes (e.g. before, after)")
    parser.add_argument("--tree", help="measure the agentrl (and tests.helpers) of this checkout instead")
    args = parser.parse_args()
    if args.tree:  # before anything imports agentrl
        sys.path.insert(0, str(Path(args.tree).resolve()))
    torch.manual_seed(0)
    result = measure(args.steps)
    from agentrl.foundation.files import write_json_atomic
    from benchmarks.readme import replace_section
    from benchmarks.step_breakdown import machine_label

    result.update(label=args.label, machine=machine_label(), date=str(datetime.date.today()))
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results[args.label] = result
    write_json_atomic(RESULTS, results)
    print(json.dumps(result, indent=1))
    lines = [
        f"GRPO training throughput, one trainer, packaged model, 8 x 8 synthetic answers "
        f"(~{result['tokens_per_step']:.0f} tokens a step), median of {result['steps']} steps after a warm-up:",
        "",
        "| code | step | tokens/s (range) | tokens computed | model FLOP utilisation (matmul peak) | micro-batch | "
        "attention | measured |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label, row in results.items():
        low, high = row["tokens_per_s_range"]
        lines.append(
            f"| {label} | {row['train_s']:.2f} s | {row['tokens_per_s']:.0f} ({low:.0f}-{high:.0f}) | "
            f"{row.get('computed_tokens_per_step', row['tokens_per_step']):.0f} | "
            f"{row['mfu']:.1%} ({row.get('matmul_peak_flops', row.get('bf16_matmul_peak_flops', 0)) / 1e12:.2f} "
            f"TFLOP/s {row.get('precision', 'bf16')}) | "
            f"{row['micro_batch_tokens']} | {row['attention']} | {row['machine']}, {row['date']} |"
        )
    top = ", ".join(f"{e['op']} {e['share']:.0%}" for e in result["profile_top"][:6])
    lines += ["", f"Profile of one step ({args.label}), self CPU time: {top}."]
    replace_section(START, END, "\n".join([START, *lines, END]))


if __name__ == "__main__":
    main()
