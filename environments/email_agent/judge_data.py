"""Labelled judge examples from the email task's answer check: the email data `agentrl judge train` ships with.

    .venv/bin/python -m agentrl_environments.email_agent.judge_data [--steps 6] [--test-every 3]

A short `--reward match` run (the SFT warm start, then RL steps of 4 x 4 rollouts) records every
group it trains on; each group whose attempts scored differently on the answer check becomes one
example, labelled by that check (which the judge never sees) and asked with RULER's default rubric,
as `agentrl train email --reward ruler` asks it. Every `--test-every`-th question is held out, with all its examples. Writes
data/judge_train.jsonl and data/judge_test.jsonl. On a 2-core float32 CPU: about 25 minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path

from agentrl.judges import JudgeExample, examples_from_groups, recorded_groups, write_examples

from .train import run

DATA = Path(__file__).with_name("data")


def task_of(example: JudgeExample) -> str:
    """What an example asks: its first attempt's messages up to the question (the system prompt and the task)."""
    first = example.message_lists[0]
    asked = next((i for i, m in enumerate(first) if m.get("role") == "user"), len(first) - 1)
    return json.dumps(first[: asked + 1], sort_keys=True)


def split_examples(examples: list[JudgeExample], test_every: int) -> tuple[list[JudgeExample], list[JudgeExample]]:
    """(train, test) by task: every `test_every`-th distinct task (1-based, in order of appearance) is held
    out with all its examples, so no held-out question was seen in training (a run meets a question again
    in later steps, and another inbox can ask the same)."""
    if test_every < 2:
        raise ValueError(f"--test-every must be at least 2 (got {test_every}): otherwise nothing is left to train on")
    order = list(dict.fromkeys(task_of(e) for e in examples))
    held_out = {task for i, task in enumerate(order, start=1) if i % test_every == 0}
    return [e for e in examples if task_of(e) not in held_out], [e for e in examples if task_of(e) in held_out]


async def make(steps: int, test_every: int, test_questions: int) -> dict[str, int]:
    with tempfile.TemporaryDirectory() as tmp:
        summary = await run("cpu", steps=steps, name="email-match", base_path=tmp, test_questions=test_questions)
        groups, _ = recorded_groups(Path(summary.run_dir), split="train", max_groups=1_000_000)
    examples = examples_from_groups(groups, source="email-agent --reward match (train)")
    if not examples:
        raise RuntimeError(f"none of the {len(groups)} recorded groups had attempts that scored differently")
    train, test = split_examples(examples, test_every)
    written = {}
    for split, chosen in (("train", train), ("test", test)):
        path = write_examples(DATA / f"judge_{split}.jsonl", chosen)
        written[split] = len(chosen)
        print(f"{split}: {len(chosen)} examples -> {path}")
    print(f"from {len(groups)} recorded groups, {len(examples)} with attempts that scored differently")
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6, help="RL steps of the labelling run (4 groups a step)")
    parser.add_argument("--test-every", type=int, default=3, help="hold out every N-th question")
    parser.add_argument("--test-questions", type=int, default=4, help="held-out questions the run evaluates on")
    args = parser.parse_args()
    asyncio.run(make(args.steps, args.test_every, args.test_questions))


if __name__ == "__main__":
    main()
