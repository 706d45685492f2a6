"""Can a judge be trained on a CPU? The packaged model taught to judge from labelled judgements.

    .venv/bin/python -m benchmarks.judge_training [--data larger-number|rubric|email] [--readout probabilities|json]
        [--sft-epochs 1] [--rl-steps 0] [--train-examples N] [--held-out N] [--keep BASE_PATH]

Each label source's shipped judge data, held out by task (the examples of a held-out question or task are
never trained on): `larger-number` (environments/larger_number/judge_data.py: the base model's sampled answers
and bare numbers, labelled by the check), `rubric` (the base model's answers to the rubric task, labelled by its
code checks, judged with the task's rubrics) and `email` (attempts of a short email run, labelled by the answer
check).

The judge (a LoRA adapter on the packaged model, alone on a LocalBackend) is checked on the held-out
examples with `check_judge` (greedy, one shuffle per group), read as `--readout` says, then taught with SFT
(`train_judge`: with probabilities, the one decision token of every differing pair in both orders; with json,
RULER's JSON in 2 orders) and then GRPO steps rewarded by agreement with the labels (`train_judge_rl`), checked
again after SFT and every `--check-every` RL steps. Results merge into benchmarks/results/judge_training.json
(one entry per data source and recipe), its table in docs/judges.md and the README's judge table. `--keep`
keeps the trained judge's run (BASE_PATH/judges/DATA-judge) for `--judge run:FOLDER`.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import itertools
import json
import math
import statistics
import tempfile
import time
from typing import Any

import agentrl
from agentrl.foundation.files import write_json_atomic
from agentrl.judge_training import train_judge, train_judge_rl
from agentrl.judges.examples import JudgeExample, load_examples
from agentrl.judges.readout import READOUTS, Readout
from agentrl.judges.ruler import ruler
from agentrl_environments.email_agent.judge_data import DATA as EMAIL_DATA
from agentrl_environments.larger_number.judge_data import DATA as LARGER_NUMBER_DATA
from agentrl_environments.rubric.tasks import DATA as RUBRIC_DATA
from benchmarks.learning import LEARNING_RESULTS
from benchmarks.readme import replace_section
from benchmarks.step_breakdown import RESULTS, machine_label

JUDGE_RESULTS = RESULTS.with_name("judge_training.json")
START, END = "<!-- benchmark:judge_training:start -->", "<!-- benchmark:judge_training:end -->"
MAX_TOKENS = 512
"""The judge's answer: room for four explanations (each bounded to 300 characters) and their scores."""


def data(name: str, train_count: int, held_out_count: int) -> tuple[list[JudgeExample], list[JudgeExample]]:
    """Train and held-out examples of one label source, held out by task."""
    folder = {"larger-number": LARGER_NUMBER_DATA, "rubric": RUBRIC_DATA, "email": EMAIL_DATA}[name]
    train, held_out = load_examples(folder / "judge_train.jsonl"), load_examples(folder / "judge_test.jsonl")
    return train[:train_count], held_out[:held_out_count]


async def diagnose(held_out: list[JudgeExample], judge: agentrl.TrainableModel) -> dict[str, Any]:
    """Where a judge read from probabilities is right, and how sure: its accuracy on the held-out label pairs by
    the length of the pair's two attempts (thirds, in characters), and the score gap between the two attempts of
    the pairs it orders right and wrong (for a pair of attempts alone, twice its P(better) - 0.5)."""
    results = await asyncio.gather(
        *(ruler(e.message_lists, judge, rubric=e.rubric, tools=e.tools, readout="probabilities") for e in held_out)
    )
    pairs = []  # (characters, gap toward the better attempt)
    for example, result in zip(held_out, results):
        for i, j in itertools.combinations(range(len(example.labels)), 2):
            if example.labels[i] != example.labels[j]:
                better, worse = (i, j) if example.labels[i] > example.labels[j] else (j, i)
                chars = len(json.dumps(example.message_lists[i])) + len(json.dumps(example.message_lists[j]))
                pairs.append((chars, result.scores[better] - result.scores[worse]))
    pairs.sort()
    thirds = [pairs[k * len(pairs) // 3 : (k + 1) * len(pairs) // 3] for k in range(3)]

    def accuracy(chunk: list[tuple[int, float]]) -> float:
        return sum(1.0 if gap > 0 else 0.5 if gap == 0 else 0.0 for _, gap in chunk) / len(chunk)

    return {
        "by_length": [
            {"chars": [chunk[0][0], chunk[-1][0]], "pairs": len(chunk), "accuracy": accuracy(chunk)}
            for chunk in thirds
            if chunk
        ],
        "gap_right": statistics.fmean([gap for _, gap in pairs if gap > 0] or [math.nan]),
        "gap_wrong": statistics.fmean([-gap for _, gap in pairs if gap < 0] or [math.nan]),
        "pairs": len(pairs),
    }


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
                trained = await train_judge(judge, train, config, readout=readout)
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
                    max_tokens=MAX_TOKENS if readout == "json" else None,
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
            diagnosis = await diagnose(held_out, judge) if readout == "probabilities" else None
        finally:
            await backend.close()
    return {
        **({"diagnosis": diagnosis} if diagnosis else {}),
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
        "| recipe | stage | held-out pairwise accuracy [95%] | tau | rank flips when shuffled | mean score by position shown | failed calls | judge tokens per group | training time | machine |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for recipe, result in results.items():
        for row in result["rows"]:
            accuracy, positions = row["pairwise_accuracy"], row["position_mean_score"]
            tokens = f"{row['tokens_per_group']:.0f}" if "tokens_per_group" in row else "-"  # recorded since readouts
            lines.append(
                f"| {recipe}; {result['held_out_examples']} held out | {row['stage']} | "
                f"{accuracy['value']:.2f} [{accuracy['low']:.2f}, {accuracy['high']:.2f}] | "
                f"{row['kendall_tau']['value']:.2f} | {row['order_rank_flip_rate']:.2f} | "
                f"{' / '.join(f'{p:.2f}' for p in positions[:4])} | {row['failed_calls']} of {row['calls']} | "
                f"{tokens} | {row['train_s']:.0f} s | {result['machine']}, {result['date']} |"
            )
    return "\n".join(lines)


DIAGNOSIS_START, DIAGNOSIS_END = "<!-- benchmark:judge_diagnosis:start -->", "<!-- benchmark:judge_diagnosis:end -->"
HEADLINE_START, HEADLINE_END = "<!-- benchmark:judge_headline:start -->", "<!-- benchmark:judge_headline:end -->"
POLICY_ROWS = {  # learning.json's runs on one task: the ceiling (trained on the check itself), and by RULER with a
    # judge trained here
    "larger-number": ("larger-number", "larger-number-ruler-trained-judge", "reward"),
    "rubric": ("rubric-checked", "rubric-ruler-trained-judge", "code-checked pass rate"),
    "email": ("email-match", "email-ruler-trained-judge", "correct, RL only (from the warm start)"),
}


def _gain(score: dict[str, Any]) -> tuple[float, float]:
    """The held-out difference and its SE: paired where the items were, else unpaired."""
    paired = score.get("paired_n", 0) > 1
    return (score["paired_difference"], score["paired_se"]) if paired else (score["difference"], score["difference_se"])


def _difference(score: dict[str, Any]) -> str:
    mean, se = _gain(score)
    return f"{score['before']:.2f} -> {score['after']:.2f} ({mean:+.3f} ± {se:.3f})"


def diagnosis_table(results: dict[str, Any]) -> str:
    """The docs' table of where each trained judge read from probabilities is right (`diagnose`)."""
    lines = [
        "| recipe | held-out accuracy by the pair's length (characters: accuracy) | score gap, pairs ordered right / wrong | pairs |",
        "| --- | --- | --- | --- |",
    ]
    for recipe, result in results.items():
        if "diagnosis" in result:
            d = result["diagnosis"]
            thirds = "; ".join(f"{t['chars'][0]}-{t['chars'][1]}: {t['accuracy']:.2f}" for t in d["by_length"])
            lines.append(f"| {recipe} | {thirds} | {d['gap_right']:.2f} / {d['gap_wrong']:.2f} | {d['pairs']} |")
    return "\n".join(lines)


def headline(results: dict[str, Any], learning: dict[str, Any]) -> str:
    """README's judge table: each label source's judge read from probabilities, untrained and after its training
    (held out by task), and where a policy was trained by RULER with that judge, its held-out gain on the check the
    judge never saw beside the gain from training on that check."""
    lines = [
        "| label source | judge's held-out pairwise accuracy: untrained -> trained [95%] | rank flips | "
        "ceiling: policy trained on the check itself, held-out check | policy trained by RULER with this judge: "
        "held-out check | share of the ceiling's gain | machine |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for result in results.values():
        if result.get("readout") != "probabilities" or len(result["rows"]) < 2:
            continue
        first, last = result["rows"][0], result["rows"][-1]
        accuracy = last["pairwise_accuracy"]
        checked, judged, score = POLICY_ROWS.get(result["data"], ("", "", ""))
        scores = [learning[name]["scores"].get(score) if name in learning else None for name in (checked, judged)]
        policy = [
            f"{learning[name]['training_reward']}: {_difference(found)}" if found else "-"
            for name, found in zip((checked, judged), scores)
        ]
        share = f"{_gain(scores[1])[0] / _gain(scores[0])[0]:.0%}" if scores[0] and scores[1] else "-"
        lines.append(
            f"| {result['data']} ({result['train_examples']} train, {result['held_out_examples']} held-out examples) | "
            f"{first['pairwise_accuracy']['value']:.2f} -> {accuracy['value']:.2f} "
            f"[{accuracy['low']:.2f}, {accuracy['high']:.2f}] | {last['order_rank_flip_rate']:.2f} | {policy[0]} | "
            f"{policy[1]} | {share} | {result['machine']}, {result['date']} |"
        )
    return "\n".join(lines)


def write_tables(results: dict[str, Any]) -> None:
    """The docs table and README's headline, from the saved results."""
    learning = json.loads(LEARNING_RESULTS.read_text()) if LEARNING_RESULTS.exists() else {}
    replace_section(START, END, f"{START}\n{table(results)}\n{END}")
    replace_section(DIAGNOSIS_START, DIAGNOSIS_END, f"{DIAGNOSIS_START}\n{diagnosis_table(results)}\n{DIAGNOSIS_END}")
    replace_section(HEADLINE_START, HEADLINE_END, f"{HEADLINE_START}\n{headline(results, learning)}\n{HEADLINE_END}")


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
    write_tables(results)
    print(table(results))


if __name__ == "__main__":
    main()
