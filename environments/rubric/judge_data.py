"""Labelled judge examples from the rubric task's code checks: the data `agentrl judge train` ships with.

    .venv/bin/python -m agentrl_environments.rubric.judge_data [--answers 4] [--max-tokens 96]

The packaged base model answers every task `--answers` times (temperature 1, as a policy samples);
each answer's label is its code-checked pass rate, the check the judge never sees. A task whose
answers all pass alike teaches no ordering and is left out. The judge is asked with the task's
rubrics, as `--reward ruler` asks it. Writes data/judge_train.jsonl (from the train tasks) and
data/judge_test.jsonl (from the held-out tasks, to check a judge with `--held-out`).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile

import agentrl
from agentrl.judges.examples import JudgeExample, examples_from_groups, write_examples

from .env import load_tasks, rollout, task_rubric
from .tasks import DATA, InstructionTask


async def labelled_examples(
    model: agentrl.Model, tasks: list[InstructionTask], *, answers: int, max_tokens: int, split: str
) -> list[JudgeExample]:
    """`answers` sampled answers per task, labelled by the task's code checks, as judge examples."""
    checked = [t for t in tasks if t.checks]
    groups = await agentrl.gather_trajectory_groups(
        [agentrl.TrajectoryGroup(rollout(model, t, max_tokens=max_tokens) for _ in range(answers)) for t in checked],
        desc=f"{split} answers",
    )
    by_id = {t.task_id: t for t in checked}
    examples = []
    for group in groups:
        task = by_id[str(group.trajectories[0].metadata["task_id"])]
        examples += examples_from_groups([group], rubric=task_rubric(task), source=f"rubric {split} {task.task_id}")
    return examples


async def make(answers: int, max_tokens: int) -> dict[str, int]:
    written = {}
    with tempfile.TemporaryDirectory() as tmp:
        sampler = agentrl.TrainableModel(name="judge-data", project="rubric", base_path=tmp)
        backend = agentrl.LocalBackend()
        try:
            await sampler.register(backend)
            base = backend.base_model()  # the untrained model: answers of the quality a fresh policy gives
            for split in ("train", "test"):
                tasks = load_tasks(split=split)
                examples = await labelled_examples(base, tasks, answers=answers, max_tokens=max_tokens, split=split)
                write_examples(DATA / f"judge_{split}.jsonl", examples)
                written[split] = len(examples)
                print(f"{split}: {len(examples)} examples from {len(tasks)} tasks -> {DATA / f'judge_{split}.jsonl'}")
        finally:
            await backend.close()
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--answers", type=int, default=4, help="sampled answers per task")
    parser.add_argument("--max-tokens", type=int, default=96, help="as the CPU preset trains")
    args = parser.parse_args()
    asyncio.run(make(args.answers, args.max_tokens))


if __name__ == "__main__":
    main()
