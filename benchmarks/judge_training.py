"""Can a judge be trained on a CPU? The packaged model taught to judge from labelled judgements.

    .venv/bin/python -m benchmarks.judge_training [--data larger-number|rubric] [--sft-epochs 2] [--rl-steps 8]

Two label sources, each with held-out examples the judge never trains on:

- `larger-number`: each question answered once with the larger number (label 1) and once with the
  smaller (label 0), in alternating order; 48 train, 32 held-out questions.
- `rubric`: the shipped judge data (environments/rubric/judge_data.py): the base model's sampled
  answers to the rubric task, labelled by its code checks, judged with the task's rubrics.

The judge (a LoRA adapter on the packaged model, alone on a LocalBackend) is checked on the held-out
examples with `check_judge` (greedy, one shuffle per group), then taught with SFT rounds
(`train_judge`, each example in 2 orders) and then GRPO steps rewarded by agreement with the labels
(`train_judge_rl`), checked again after each round and every `--check-every` RL steps. Results merge
into benchmarks/results/judge_training.json (one entry per data source and recipe) and its table in the docs.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import tempfile
import time
from typing import Any

import agentrl
from agentrl.files import write_json_atomic
from agentrl.judges.examples import JudgeExample, load_examples
from agentrl.judges.readout import READOUTS, Readout
from agentrl.judges.training import train_judge, train_judge_rl
from agentrl_environments.email_agent.judge_data import DATA as EMAIL_DATA
from agentrl_environments.larger_number.judge_data import judge_examples
from agentrl_environments.rubric.tasks import DATA as RUBRIC_DATA
from benchmarks.readme import replace_section
from benchmarks.step_breakdown import RESULTS, machine_label

JUDGE_RESULTS = RESULTS.with_name("judge_training.json")
START, END = "<!-- benchmark:judge_training:start -->", "<!-- benchmark:judge_training:end -->"
MAX_TOKENS = 512
"""The judge's answer: room for four explanations (each bounded to 300 characters) and their scores."""


def data(name: str, train_count: int, held_out_count: int) -> tuple[list[JudgeExample], list[JudgeExample]]:
    """Train and held-out examples of one label source, held out by task."""
    if name == "larger-number":
        return judge_examples("train", train_count, seed=1), judge_examples("test", held_out_count, seed=2)
    folder = RUBRIC_DATA if name == "rubric" else EMAIL_DATA
    train, held_out = load_examples(folder / "judge_train.jsonl"), load_examples(folder / "judge_test.jsonl")
    return train[:train_count], held_out[:held_out_count]


async def measure(
    name: str,
    sft: dict[str, Any],
    rl: dict[str, Any],
    check_every: int,
    counts: tuple[int, int],
    keep: str | None,
    readout: Readout,
) -> dict[str, Any]:
    train, held_out = data(name, *counts)
    params = {"max_tokens": MAX_TOKENS, "temperature": 0.0}
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        judge = agentrl.TrainableModel(name=f"{name}-judge", project="judges", base_path=keep or tmp)
        if judge.run_dir.exists():
            raise SystemExit(
                f"{judge.run_dir} exists; the benchmark trains a fresh judge (remove it or keep elsewhere)"
            )
        backend = agentrl.LocalBackend()

        async def check(stage: str, seconds: float, extra: dict[str, Any]) -> None:
            report = await agentrl.check_judge(
                [e.group() for e in held_out],
                judge,
                permutations=1,
                repeats=0,
                extra_litellm_params=params,
                readout=readout,
            )
            rows.append(
                {
                    "stage": stage,
                    "train_s": seconds,
                    **extra,
                    "pairwise_accuracy": report.pairwise_accuracy.model_dump(),
                    "kendall_tau": report.kendall_tau.model_dump(),
                    "order_rank_flip_rate": report.order_rank_flip_rate,
                    "position_mean_score": report.position_mean_score,
                    "failed_calls": report.failed_calls,
                    "calls": report.calls,
                    "readout": report.readout,
                    "latency_s_mean": report.latency_s_mean,
                    "tokens_per_group": report.prompt_tokens_per_group + report.completion_tokens_per_group,
                }
            )
            print(json.dumps(rows[-1]), flush=True)

        try:
            await judge.register(backend)
            await check("untrained", 0.0, {})
            if sft["epochs"]:
                started = time.perf_counter()
                config = agentrl.SFTConfig(epochs=sft["epochs"], batch_size=8, learning_rate=sft["learning_rate"])
                trained = await train_judge(judge, train, config, orders=2, readout=readout)
                await check(
                    f"SFT, {sft['epochs']} epochs",
                    time.perf_counter() - started,
                    {"sft_loss": trained.metrics["sft_loss"]},
                )
            done = 0
            while done < rl["steps"]:
                started = time.perf_counter()
                steps = min(check_every, rl["steps"] - done)
                results = await train_judge_rl(
                    judge,
                    train,
                    agentrl.TrainConfig(learning_rate=rl["learning_rate"]),
                    steps=steps,
                    examples_per_step=8,
                    samples_per_example=rl["samples"],
                    max_tokens=MAX_TOKENS,
                    readout=readout,
                )
                done += steps
                agreement = [r.metrics["reward_mean"] for r in results]
                skipped = sum(r.skipped for r in results)
                await check(
                    f"+ RL, {done} steps",
                    time.perf_counter() - started,
                    {"rl_train_agreement": agreement, "rl_skipped": skipped},
                )
        finally:
            await backend.close()
    return {
        "data": name,
        "machine": machine_label(),
        "date": datetime.date.today().isoformat(),
        "train_examples": len(train),
        "held_out_examples": len(held_out),
        "sft": sft,
        "rl": rl,
        "readout": readout,
        "rows": rows,
        **({"judge_run": str(judge.run_dir.resolve())} if keep else {}),
    }


def table(results: dict[str, Any]) -> str:
    lines = [
        "| recipe | stage | held-out pairwise accuracy [95%] | tau | rank flips when shuffled | mean score by position shown | failed calls | training time | machine |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for recipe, result in results.items():
        for row in result["rows"]:
            accuracy, positions = row["pairwise_accuracy"], row["position_mean_score"]
            lines.append(
                f"| {recipe}; {result['held_out_examples']} held out | {row['stage']} | "
                f"{accuracy['value']:.2f} [{accuracy['low']:.2f}, {accuracy['high']:.2f}] | "
                f"{row['kendall_tau']['value']:.2f} | {row['order_rank_flip_rate']:.2f} | "
                f"{' / '.join(f'{p:.2f}' for p in positions[:4])} | {row['failed_calls']} of {row['calls']} | "
                f"{row['train_s']:.0f} s | {result['machine']}, {result['date']} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", choices=("larger-number", "rubric", "email"), default="rubric")
    parser.add_argument("--readout", choices=READOUTS, default="probabilities", help="how the judge's decision is read")
    parser.add_argument("--sft-epochs", type=int, default=2)
    parser.add_argument("--sft-learning-rate", type=float, default=2e-3)
    parser.add_argument("--rl-steps", type=int, default=8)
    parser.add_argument("--rl-learning-rate", type=float, default=1e-4)
    parser.add_argument("--samples", type=int, default=4, help="judge answers per example in an RL step")
    parser.add_argument("--check-every", type=int, default=4, help="RL steps between held-out checks")
    parser.add_argument("--train-examples", type=int, default=48, help="labelled examples (groups) trained on")
    parser.add_argument("--held-out", type=int, default=32, help="held-out examples (groups) checked")
    parser.add_argument(
        "--keep", default=None, help="a base path to keep the trained judge's run in (judges/DATA-judge)"
    )
    parser.add_argument("--table-only", action="store_true", help="rewrite the docs table from the saved results")
    args = parser.parse_args()
    results: dict[str, Any] = json.loads(JUDGE_RESULTS.read_text()) if JUDGE_RESULTS.exists() else {}
    if not args.table_only:
        key = (
            f"{args.data}: {args.train_examples} examples, SFT {args.sft_epochs} epochs, RL {args.rl_steps} steps "
            f"(lr {args.rl_learning_rate:g}, {args.samples} answers each)"
            + (", read from probabilities" if args.readout == "probabilities" else "")
        )
        results[key] = asyncio.run(
            measure(
                args.data,
                {"epochs": args.sft_epochs, "learning_rate": args.sft_learning_rate},
                {"steps": args.rl_steps, "learning_rate": args.rl_learning_rate, "samples": args.samples},
                args.check_every,
                (args.train_examples, args.held_out),
                args.keep,
                args.readout,
            )
        )
        write_json_atomic(JUDGE_RESULTS, results)
    text = table(results)
    replace_section(START, END, f"{START}\n{text}\n{END}")
    print(text)


if __name__ == "__main__":
    main()
