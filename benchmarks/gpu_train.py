"""GRPO training on a GPU: step time, tokens/s, model FLOP utilisation and peak memory, shared prefix or not.

    python -m benchmarks.gpu_train [--models smollm2-135m,qwen2.5-1.5b,qwen2.5-3b,qwen2.5-7b] [--steps 3]

Needs no hub: each model is built from its architecture with random weights (they cost what trained
weights cost to compute) and saved with the packaged model's tokenizer, whose ids lie below every
vocabulary here. The step: 8 groups x 8 rollouts, each a 768-token prompt (a system prompt with tool
schemas, a question) shared by its group and a 256-token answer: 65,536 tokens, the step that
docs/scaling.md modelled. Each model trains that step unshared and with the shared prefix
(`TrainConfig.shared_prefix`), alternating, after one warm-up step each way (where the default
micro-batch does not fit, the trainer halves it then); then the loss and gradients both ways from the
same weights are compared, with `kl_coef=0.1` (docs/scaling.md says what that shows in bf16). Model FLOP utilisation counts 4 x the decoder's
linear weights per computed token plus 4 x the head per loss token (LoRA: no base weight gradients)
against this GPU's bf16 matmul rate at the model's MLP shape, measured in the same run.

Writes benchmarks/results/gpu_train.json (`--out` elsewhere) and its table in the docs
(`--table-only` rewrites the table from the file).
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import agentrl
from agentrl.foundation.base_models import resolve_base_model
from agentrl.foundation.files import write_json_atomic
from benchmarks.readme import replace_section
from benchmarks.step_breakdown import RESULTS

GPU_RESULTS = RESULTS.with_name("gpu_train.json")
START, END = "<!-- benchmark:gpu_train:start -->", "<!-- benchmark:gpu_train:end -->"
GROUPS, ROLLOUTS, PROMPT_TOKENS, ANSWER_TOKENS = 8, 8, 768, 256

ARCHITECTURES: dict[str, dict[str, Any]] = {
    # Qwen2.5's published shapes (config.json of each model on the hub)
    "qwen2.5-1.5b": dict(
        hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
        num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
    ),
    "qwen2.5-3b": dict(
        hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
        num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
    ),
    "qwen2.5-7b": dict(
        hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False,
    ),
}  # fmt: skip


def build_model(name: str, folder: Path, packaged: str) -> Path:
    """`name`'s architecture with random bf16 weights (made on the GPU) and the tokenizer of `packaged`
    (a folder with the packaged model's config and tokenizer), saved in `folder`."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, Qwen2Config

    if name == "smollm2-135m":
        config = AutoConfig.from_pretrained(packaged)
    else:
        config = Qwen2Config(**ARCHITECTURES[name], max_position_embeddings=32768, rms_norm_eps=1e-6)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)  # type: ignore[no-untyped-call]
    path = folder / name
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(packaged).save_pretrained(path)
    del model
    torch.cuda.empty_cache()
    return path


def agent_groups(tokenizer: Any, seed: int) -> list[agentrl.TrajectoryGroup]:
    """8 groups x 8 rollouts: a group's 768-token prompt shared, each answer 256 tokens of its own."""
    from tests.helpers import WORDS, make_choice

    rng = random.Random(seed)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    groups = []
    for _ in range(GROUPS):
        words = " ".join(rng.choice(WORDS) for _ in range(2 * PROMPT_TOKENS))
        system = tokenizer.decode(tokenizer.encode(words, add_special_tokens=False)[: PROMPT_TOKENS - 40])
        question = " ".join(rng.choice(WORDS) for _ in range(12)) + "?"
        trajectories = []
        for _ in range(ROLLOUTS):
            text = " ".join(rng.choice(WORDS) for _ in range(ANSWER_TOKENS))
            ids = tokenizer.encode(text, add_special_tokens=False)[: ANSWER_TOKENS - 1] + [end]
            trajectories.append(
                agentrl.Trajectory(
                    messages_and_choices=[
                        {"role": "system", "content": system},
                        {"role": "user", "content": question},
                        make_choice(ids, [-rng.uniform(0.1, 3.0) for _ in ids], content=tokenizer.decode(ids[:-1])),
                    ],
                    reward=rng.random(),
                )
            )
        groups.append(agentrl.TrajectoryGroup(trajectories))
    return groups


def matmul_peak(hidden: int, intermediate: int) -> float:
    """bf16 FLOP/s of a (16,384 x hidden) @ (hidden x intermediate) matmul on the GPU, best of 20."""
    a = torch.randn(16384, hidden, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(hidden, intermediate, dtype=torch.bfloat16, device="cuda")
    times = []
    for i in range(23):
        torch.cuda.synchronize()
        started = time.perf_counter()
        a @ b
        torch.cuda.synchronize()
        if i >= 3:
            times.append(time.perf_counter() - started)
    return 2 * 16384 * hidden * intermediate / min(times)


def measure(name: str, path: Path, steps: int) -> dict[str, Any]:
    from agentrl.backend.training.trainer import Trainer
    from benchmarks.shared_prefix import agreement
    from benchmarks.train_throughput import weight_counts

    load_started = time.perf_counter()
    trainer = Trainer(str(path), seed=0, device="cuda")
    trainer.add_adapter("bench", agentrl.LoRAConfig())
    load_s = time.perf_counter() - load_started
    base = trainer.model.get_base_model()
    decoder_weights, head_weights = weight_counts(base)
    config = agentrl.TrainConfig(learning_rate=1e-6)
    rows: dict[str, list[dict[str, float]]] = {"unshared": [], "shared": []}
    for step in range(steps + 1):
        groups = agent_groups(trainer.tokenizer, step)
        for mode in rows:
            torch.cuda.reset_peak_memory_stats()
            metrics = trainer.train_step(
                "bench", groups, config.model_copy(update={"shared_prefix": mode == "shared"})
            ).metrics
            metrics["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
            print(
                f"{name} {mode}: {metrics['train_s']:.2f} s, {metrics['forward_tokens']:.0f} tokens computed, "
                f"peak {metrics['peak_gib']:.1f} GiB, micro-batch {metrics['micro_batch_tokens']:.0f}",
                flush=True,
            )
            if step:
                rows[mode].append(metrics)
    # after the warm-up, which halves the default micro-batch where it does not fit (`Trainer._within_memory`)
    check = agreement(trainer, agent_groups(trainer.tokenizer, 100), config.model_copy(update={"kl_coef": 0.1}))
    print(f"{name}: loaded in {load_s:.1f} s; shared vs unshared {check}", flush=True)
    peak = matmul_peak(base.config.hidden_size, base.config.intermediate_size)
    result: dict[str, Any] = {
        "model": name,
        "parameters": sum(p.numel() for p in base.parameters()),
        "load_s": load_s,
        "matmul_peak_flops": peak,
        "agreement": check,
        "micro_batch_tokens": trainer.micro_batch_tokens,
    }
    for mode, timed in rows.items():
        train_s = statistics.median(m["train_s"] for m in timed)
        computed = statistics.mean(m["forward_tokens"] for m in timed)
        trained = statistics.mean(m["trained_tokens"] for m in timed)
        flops = 4 * decoder_weights * computed + 4 * head_weights * trained
        result[mode] = {
            "tokens": statistics.mean(m["total_tokens"] for m in timed),
            "forward_tokens": computed,
            "train_s": train_s,
            "train_s_range": [min(m["train_s"] for m in timed), max(m["train_s"] for m in timed)],
            "tokens_per_s": statistics.mean(m["total_tokens"] for m in timed) / train_s,
            "mfu": flops / train_s / peak,
            "peak_gib": max(m["peak_gib"] for m in timed),
        }
    del trainer
    torch.cuda.empty_cache()
    return result


def table(results: dict[str, Any]) -> str:
    lines = [
        "| model (random weights) | GPU | step unshared | step shared | speed-up | tokens computed, shared | "
        "tokens/s unshared | MFU unshared / shared | peak memory unshared / shared | micro-batch | "
        "loss / gradient difference, kl_coef 0.1 |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results.values():
        plain, shared, check = r["unshared"], r["shared"], r["agreement"]
        lines.append(
            f"| {r['model']} ({r['parameters'] / 1e9:.2f} B) | {r['gpu']}, {r['date']} | {plain['train_s']:.2f} s | "
            f"{shared['train_s']:.2f} s | {plain['train_s'] / shared['train_s']:.2f}x | {shared['forward_tokens']:.0f} "
            f"of {plain['tokens']:.0f} | {plain['tokens_per_s']:.0f} | {plain['mfu']:.0%} / {shared['mfu']:.0%} | "
            f"{plain['peak_gib']:.1f} / {shared['peak_gib']:.1f} GiB | {r.get('micro_batch_tokens') or 16384} | "
            f"{check['loss_relative_difference']:.1e} / "
            f"{check['gradient_relative_gap']:.1e} |"
        )
    return (
        f"One GRPO step on one GPU ({GROUPS} groups x {ROLLOUTS} rollouts of a {PROMPT_TOKENS}-token shared prompt "
        f"and a {ANSWER_TOKENS}-token answer, bf16, rank-8 LoRA, median of the timed steps after a warm-up; MFU "
        "against the GPU's measured bf16 matmul rate at the model's MLP shape):\n\n" + "\n".join(lines) + "\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="smollm2-135m,qwen2.5-1.5b,qwen2.5-3b,qwen2.5-7b")
    parser.add_argument("--steps", type=int, default=3, help="timed steps each way after one warm-up")
    parser.add_argument("--out", type=Path, default=GPU_RESULTS)
    parser.add_argument(
        "--packaged",
        help="a folder with the packaged model's config.json and tokenizer files (default: the packaged model)",
    )
    parser.add_argument("--table-only", action="store_true")
    args = parser.parse_args()
    results: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    if not args.table_only:
        if not torch.cuda.is_available():
            raise SystemExit("benchmarks.gpu_train needs a CUDA GPU; on a CPU run benchmarks.shared_prefix")
        gpu = torch.cuda.get_device_name()
        packaged = args.packaged or resolve_base_model("smollm2-135m-instruct")
        with tempfile.TemporaryDirectory() as folder:
            for name in args.models.split(","):
                result = measure(name, build_model(name, Path(folder), packaged), args.steps)
                result.update(gpu=gpu, date=str(datetime.date.today()), torch=torch.__version__)
                results[f"{name} | {gpu}"] = result
                write_json_atomic(args.out, results)
                print(json.dumps(result, indent=1), flush=True)
    text = table(results)
    print(text)
    if args.out == GPU_RESULTS:
        replace_section(START, END, f"{START}\n{text}{END}")


if __name__ == "__main__":
    main()
