"""Debiased RULER against plain RULER on the same labelled groups: order flips, agreement, tokens.

    .venv/bin/python -m benchmarks.debiased_ruler [--groups 16] [--permutations 3]

The groups are the shipped held-out judge examples of the rubric task (the base model's answers,
labelled by code checks the judge never sees); the judge is the packaged base model on a local
server, greedy. Each group is scored twice by each method, the two scorings differing only in the
order the attempts are shown:

- plain RULER: one judgement in the recorded order, then one in a shuffled order (what the audit does);
- debiased RULER (`ruler_score_group(..., permutations=k)`): k orders averaged, twice, with different
  shuffles (both include the recorded order).

Reported per method: the rank flip rate between its two scorings (how much the reward depends on the
order of presentation), pairwise accuracy against the labels (over both scorings), and judge tokens
per group. Writes benchmarks/results/debiased_ruler.json and its table in the docs.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import statistics
import tempfile
from typing import Any

import agentrl
from agentrl.foundation.files import write_json_atomic
from agentrl.judges.agreement import pair_counts, pairwise_accuracy, rank_flip_rate
from agentrl.judges.audit import JudgeAudit
from agentrl.judges.examples import load_examples
from agentrl_environments.rubric.tasks import DATA as RUBRIC_DATA
from benchmarks.readme import replace_section
from benchmarks.step_breakdown import RESULTS, machine_label

DEBIASED_RESULTS = RESULTS.with_name("debiased_ruler.json")
START, END = "<!-- benchmark:debiased_ruler:start -->", "<!-- benchmark:debiased_ruler:end -->"
PARAMS = {"max_tokens": 512, "temperature": 0.0}


async def scorings(
    group: agentrl.TrajectoryGroup, judge: agentrl.Model, rubric: str, permutations: int
) -> tuple[list[float], list[float], float] | None:
    """Two scorings of `group` that differ in presentation order, and the judge tokens of both (None: a failure)."""
    judged = []
    for seed in (1, 2):
        # Plain RULER: the recorded order, then (seed 2) one shuffled order, as the audit draws it.
        shown = group
        if permutations == 1 and seed == 2:
            order = JudgeAudit(seed=seed).order("plain", len(group.trajectories))
            shown = agentrl.TrajectoryGroup([group.trajectories[i] for i in order])
        result = await agentrl.ruler_score_group(
            shown,
            judge,
            rubric=rubric,
            permutations=permutations,
            audit=JudgeAudit(fraction=0.0, seed=seed),
            swallow_exceptions=True,
            extra_litellm_params=PARAMS,
        )
        if not result.trajectories:
            return None
        scores = [t.reward for t in result.trajectories]
        if shown is not group:  # back to the recorded order
            aligned = [0.0] * len(scores)
            for position, original in enumerate(order):
                aligned[original] = scores[position]
            scores = aligned
        judged.append((scores, result.metrics["judge_tokens"]))
    (first, tokens_a), (second, tokens_b) = judged
    return first, second, tokens_a + tokens_b


async def measure(groups_count: int, permutations: int) -> dict[str, Any]:
    examples = load_examples(RUBRIC_DATA / "judge_test.jsonl")[:groups_count]
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        sampler = agentrl.TrainableModel(name="debiased", project="bench", base_path=tmp)
        backend = agentrl.LocalBackend()
        try:
            await sampler.register(backend)
            judge = backend.base_model()
            for label, k in (("plain RULER", 1), (f"debiased RULER, {permutations} orders", permutations)):
                outcomes = await asyncio.gather(*(scorings(e.group(), judge, e.rubric, k) for e in examples))
                flips, counts, tokens, failed = [], [], [], 0
                for example, outcome in zip(examples, outcomes):
                    if outcome is None:
                        failed += 1
                        continue
                    first, second, used = outcome
                    flips.append(rank_flip_rate(first, second))
                    counts += [pair_counts(example.labels, first), pair_counts(example.labels, second)]
                    tokens.append(used / 2)  # one scoring's tokens
                rows[label] = {
                    "permutations": k,
                    "flip_rate": statistics.fmean(flips) if flips else None,
                    "pairwise_accuracy": dataclasses.asdict(pairwise_accuracy(counts)) if counts else None,
                    "tokens_per_group": statistics.fmean(tokens) if tokens else None,
                    "failed_groups": failed,
                }
                print(label, rows[label], flush=True)
        finally:
            await backend.close()
    return {
        "machine": machine_label(),
        "date": datetime.date.today().isoformat(),
        "groups": len(examples),
        "rows": rows,
    }


def table(result: dict[str, Any]) -> str:
    lines = [
        f"Rubric task held-out judge examples ({result['groups']} groups of 4 answers, labels from code checks), "
        f"judged by the packaged base model, greedy; {result['machine']}, {result['date']}:",
        "",
        "| method | rank flips between two presentation orders | pairwise accuracy vs labels [95%] | judge tokens per group | failed groups |",
        "| --- | --- | --- | --- | --- |",
    ]
    for label, row in result["rows"].items():
        accuracy = row["pairwise_accuracy"]
        shown = f"{accuracy['value']:.2f} [{accuracy['low']:.2f}, {accuracy['high']:.2f}]" if accuracy else "-"
        flips = f"{row['flip_rate']:.2f}" if row["flip_rate"] is not None else "-"
        tokens = f"{row['tokens_per_group']:.0f}" if row["tokens_per_group"] is not None else "-"
        lines.append(f"| {label} | {flips} | {shown} | {tokens} | {row['failed_groups']} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--permutations", type=int, default=3)
    args = parser.parse_args()
    result = asyncio.run(measure(args.groups, args.permutations))
    write_json_atomic(DEBIASED_RESULTS, result)
    text = table(result)
    replace_section(START, END, f"{START}\n{text}\n{END}")
    print(text)


if __name__ == "__main__":
    main()
