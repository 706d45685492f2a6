"""Labelled judge examples from the larger-number check: the data `agentrl judge train` ships with for it.

    .venv/bin/python -m agentrl_environments.larger_number.judge_data [--train 256] [--test 64] [--answers 8]

Each question is answered `--answers` times by the packaged base model at temperature 1, as the policy
answers at the start of a run ("The larger number is 73.", "45", "73 is larger than 45", ...), and each
answer is labelled by the check, which the judge never sees. Every question gives two-attempt examples: a
right answer against each of up to two distinct wrong ones sampled (a bare larger number stands in when no
sampled answer is right), and the bare larger number against the bare smaller one. Train and held-out
examples come from the task's own split (`task.scenarios`): held-out questions are pairs of numbers the
judge never trains on. Writes data/judge_train.jsonl and data/judge_test.jsonl. About 2 minutes on a CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
from pathlib import Path

import agentrl
from agentrl.judges import JudgeExample, write_examples

from .task import Scenario, reward, rollout, scenarios

DATA = Path(__file__).with_name("data")
RUBRIC = "- Score 1 for the larger of the two numbers, 0 for anything else."
WRONG_PER_QUESTION = 2


def example(scenario: Scenario, answers: list[tuple[str, float]], source: str) -> JudgeExample:
    """One judge example: the question answered each way, labelled."""
    return JudgeExample(
        message_lists=[
            [{"role": "user", "content": scenario.prompt}, {"role": "assistant", "content": text}]
            for text, _ in answers
        ],
        labels=[label for _, label in answers],
        rubric=RUBRIC,
        source=source,
    )


def question_examples(scenario: Scenario, sampled: list[str], rng: random.Random, source: str) -> list[JudgeExample]:
    """A right answer against each of up to `WRONG_PER_QUESTION` distinct wrong ones (in a random order),
    and the bare larger number against the bare smaller one."""
    right = [a for a in sampled if reward(a, scenario) == 1.0] or [str(scenario.answer)]
    wrong = list(dict.fromkeys(a for a in sampled if reward(a, scenario) == 0.0))[:WRONG_PER_QUESTION]
    pairs = [[(rng.choice(right), 1.0), (w, 0.0)] for w in wrong]
    pairs.append([(str(scenario.answer), 1.0), (str(min(scenario.a, scenario.b)), 0.0)])
    for pair in pairs:
        rng.shuffle(pair)
    return [example(scenario, pair, source) for pair in pairs]


async def sampled_examples(
    model: agentrl.Model, split: str, count: int, *, answers: int, seed: int
) -> list[JudgeExample]:
    """`count` questions of `split`, each answered `answers` times by `model`, as judge examples."""
    questions = scenarios(split, count, seed=seed)
    groups = await agentrl.gather_trajectory_groups(
        [agentrl.TrajectoryGroup(rollout(model, s) for _ in range(answers)) for s in questions],
        desc=f"{split} answers",
    )
    by_question = {(g.trajectories[0].metadata["a"], g.trajectories[0].metadata["b"]): g for g in groups}
    rng = random.Random(seed)
    examples = []
    for scenario in questions:
        group = by_question[(scenario.a, scenario.b)]
        sampled = [t.messages()[-1].get("content") or "" for t in group.trajectories]
        examples += question_examples(scenario, sampled, rng, f"larger-number {split}, base model at temperature 1")
    return examples


async def main_async(train: int, test: int, answers: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        model = agentrl.TrainableModel(name="judge-data", project="larger-number", base_path=tmp)
        backend = agentrl.LocalBackend()
        try:
            await model.register(backend)
            for split, count, seed in (("train", train, 1), ("test", test, 2)):
                examples = await sampled_examples(model, split, count, answers=answers, seed=seed)
                path = write_examples(DATA / f"judge_{split}.jsonl", examples)
                print(f"wrote {len(examples)} examples from {count} {split} questions to {path}")
        finally:
            await backend.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train", type=int, default=256, help="training questions")
    parser.add_argument("--test", type=int, default=64, help="held-out questions (the task's test split)")
    parser.add_argument("--answers", type=int, default=8, help="answers sampled per question")
    args = parser.parse_args()
    asyncio.run(main_async(args.train, args.test, args.answers))


if __name__ == "__main__":
    main()
