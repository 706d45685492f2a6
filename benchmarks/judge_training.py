"""Can a judge be trained on a CPU? The packaged model taught to judge from labelled judgements.

    .venv/bin/python -m benchmarks.judge_training [--rounds 3] [--train-groups 48] [--held-out 32]

Labels come from the larger-number task's check: each group is a question answered once with the
larger number (label 1) and once with the smaller (label 0), in alternating order. The judge (a
LoRA adapter on the packaged model, beside nothing else on a LocalBackend) is checked on held-out
questions with `check_judge` (greedy, one shuffle per group), then trained with `train_judge`
(SFT, 2 epochs a round, each example in 2 orders) and checked again after every round. Writes
benchmarks/results/judge_training.json and the README table.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import tempfile
import time

import agentrl
from agentrl.files import write_json_atomic
from agentrl.judges.training import examples_from_groups, train_judge
from benchmarks.readme import replace_section
from benchmarks.step_breakdown import RESULTS, cpu_name
from environments.larger_number.task import scenarios

JUDGE_RESULTS = RESULTS.with_name("judge_training.json")
START, END = "<!-- benchmark:judge_training:start -->", "<!-- benchmark:judge_training:end -->"
RUBRIC = "- Score 1 for the larger of the two numbers, 0 for anything else."


def labelled_groups(split: str, count: int, seed: int) -> list[agentrl.TrajectoryGroup]:
    """Each question answered right (label 1) and with the smaller number (label 0), order alternating."""
    groups = []
    for i, s in enumerate(scenarios(split, count, seed=seed)):
        answers = [(str(s.answer), 1.0), (str(min(s.a, s.b)), 0.0)][:: 1 if i % 2 else -1]
        groups.append(
            agentrl.TrajectoryGroup(
                agentrl.Trajectory(
                    reward=label,
                    messages_and_choices=[
                        {"role": "user", "content": s.prompt},
                        {"role": "assistant", "content": answer},
                    ],
                )
                for answer, label in answers
            )
        )
    return groups


async def measure(rounds: int, train_groups: int, held_out_groups: int) -> dict:
    held_out = labelled_groups("test", held_out_groups, seed=2)
    examples = examples_from_groups(labelled_groups("train", train_groups, seed=1), rubric=RUBRIC)
    params = {"max_tokens": 200, "temperature": 0.0}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        judge = agentrl.TrainableModel(name="judge", project="bench", base_path=tmp)
        backend = agentrl.LocalBackend()
        try:
            await judge.register(backend)
            for round_ in range(rounds + 1):
                sft: dict[str, float] = {}
                started = time.perf_counter()
                if round_:
                    config = agentrl.SFTConfig(epochs=2, batch_size=8, learning_rate=2e-3)
                    sft = (await train_judge(judge, examples, config, orders=2, seed=round_)).metrics
                train_s = time.perf_counter() - started
                report = await agentrl.check_judge(
                    held_out, judge, rubric=RUBRIC, permutations=1, repeats=0, extra_litellm_params=params
                )
                rows.append(
                    {
                        "epochs": 2 * round_,
                        "train_s": train_s,
                        "sft_loss": sft.get("sft_loss"),
                        "pairwise_accuracy": report.pairwise_accuracy.model_dump(),
                        "kendall_tau": report.kendall_tau.model_dump(),
                        "order_rank_flip_rate": report.order_rank_flip_rate,
                        "position_mean_score": report.position_mean_score,
                        "failed_calls": report.failed_calls,
                        "calls": report.calls,
                    }
                )
                print(rows[-1], flush=True)
        finally:
            await backend.close()
    return {
        "machine": f"{cpu_name()}, {os.cpu_count()} cores",
        "date": datetime.date.today().isoformat(),
        "train_examples": len(examples),
        "held_out_groups": held_out_groups,
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="SFT rounds of 2 epochs each")
    parser.add_argument("--train-groups", type=int, default=48)
    parser.add_argument("--held-out", type=int, default=32)
    args = parser.parse_args()
    result = asyncio.run(measure(args.rounds, args.train_groups, args.held_out))
    write_json_atomic(JUDGE_RESULTS, result)
    lines = [
        START,
        f"Judge training on the larger-number check, {result['machine']}, {result['date']} "
        f"({result['train_examples']} labelled groups of 2, each shown in 2 orders; {result['held_out_groups']} "
        "held-out groups, greedy, one shuffle each):",
        "",
        "| SFT epochs | held-out pairwise accuracy [95%] | tau | rank flips when shuffled | mean score, 1st / 2nd shown | failed calls | SFT time |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in result["rows"]:
        accuracy, positions = row["pairwise_accuracy"], row["position_mean_score"]
        lines.append(
            f"| {row['epochs']} | {accuracy['value']:.2f} [{accuracy['low']:.2f}, {accuracy['high']:.2f}] | "
            f"{row['kendall_tau']['value']:.2f} | {row['order_rank_flip_rate']:.2f} | "
            f"{' / '.join(f'{p:.2f}' for p in positions)} | {row['failed_calls']} of {row['calls']} | "
            f"{row['train_s']:.0f} s |"
        )
    lines.append(END)
    table = "\n".join(lines)
    replace_section(START, END, table)
    print(table)


if __name__ == "__main__":
    main()
