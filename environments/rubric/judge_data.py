"""Labelled judge examples from the rubric task's code checks: the data `agentrl judge train` ships with.

    .venv/bin/python -m agentrl_environments.rubric.judge_data [--answers 4] [--max-tokens 96]

The packaged base model answers every task `--answers` times (temperature 1, as a policy samples);
each answer's label is its code-checked pass rate, the check the judge never sees. A task whose
answers all pass alike teaches no ordering and is left out. The judge is asked with the task's
rubrics, as `--reward ruler` asks it. Writes data/judge_train.jsonl (from the train tasks) and
data/judge_test.jsonl (from the held-out tasks, to check a judge with `--held-out`), and from the same
answers the rubric judge's data (`agentrl judge train --kind rubric`): data/verdict_{train,test}.jsonl, one
line per answer and code-checkable rubric, labelled by that rubric's check (balanced: as many passing as failing). `--verdicts-only` rewrites
those two from the judge files already there, sampling nothing.

`--from-run RUN_FOLDER` builds the same files from a training run's recorded answers instead of the base
model's (a policy's answers as training moves them, labelled by the same checks): the recorded train groups
give data/judge_policy_train.jsonl and data/verdict_policy_train.jsonl, the recorded held-out answers (other
tasks) data/judge_policy_test.jsonl and data/verdict_policy_test.jsonl. A judge trained on the base model's
answers never saw the short or reformatted answers a policy drifts to, and a policy finds them.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
from pathlib import Path

import agentrl
from agentrl.judges import (
    JudgeExample,
    VerdictExample,
    examples_from_groups,
    load_examples,
    write_examples,
    write_verdict_examples,
)
from agentrl.records import RunFolder, load_trajectories

from .env import load_tasks, rollout, task_rubric
from .tasks import DATA, InstructionTask, checked_pass_rate, passes


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


def verdict_examples(examples: list[JudgeExample], tasks: list[InstructionTask]) -> list[VerdictExample]:
    """Each answer of each judge example, once per code-checkable rubric of its task (the training wording),
    labelled by that rubric's check."""
    by_id = {t.task_id: t for t in tasks}
    verdicts = []
    for example in examples:
        task = by_id[example.source.rsplit(" ", 1)[-1]]
        for number, messages in enumerate(example.message_lists):
            response = str(messages[-1].get("content") or "")
            for rubric, check in zip(task.rubrics, task.checks or []):
                if check is not None:
                    verdicts.append(
                        VerdictExample(
                            prompt=task.prompt,
                            response=response,
                            rubric=rubric,
                            passed=passes(check, response),
                            source=f"{example.source} answer {number + 1}",
                        )
                    )
    return verdicts


VERDICTS_PER_LABEL = {"train": 400, "test": 150}
"""Verdicts kept per label (passing, failing) and split: balanced, so a judge that always answers one way
scores 0.5, and small enough for one SFT epoch in minutes on a CPU."""


def balanced(verdicts: list[VerdictExample], per_label: int, seed: int = 0) -> list[VerdictExample]:
    """`per_label` passing and as many failing verdicts (fewer where fewer exist), drawn with `seed`, in file order."""
    rng = random.Random(seed)
    kept: set[int] = set()
    for label in (True, False):
        indices = [k for k, v in enumerate(verdicts) if v.passed == label]
        kept.update(rng.sample(indices, min(per_label, len(indices))))
    return [v for k, v in enumerate(verdicts) if k in kept]


def write_verdicts() -> dict[str, int]:
    """data/verdict_{split}.jsonl from data/judge_{split}.jsonl, balanced (`VERDICTS_PER_LABEL`)."""
    written = {}
    for split in ("train", "test"):
        every = verdict_examples(load_examples(DATA / f"judge_{split}.jsonl"), load_tasks(split=split))
        verdicts = balanced(every, VERDICTS_PER_LABEL[split])
        write_verdict_examples(DATA / f"verdict_{split}.jsonl", verdicts)
        written[split] = len(verdicts)
        passed = sum(v.passed for v in verdicts)
        print(f"{split}: {len(verdicts)} verdicts ({passed} passing) -> {DATA / f'verdict_{split}.jsonl'}")
    return written


RUN_SPLITS = {"train": "train", "test": "val"}
"""Which recorded trajectories of a run give each split's data: its training groups, its held-out answers."""


def answers_from_run(run_dir: Path, split: str) -> list[tuple[InstructionTask, str, list[agentrl.Trajectory]]]:
    """The answers `run_dir` recorded (`RUN_SPLITS[split]`), grouped by step and task (a held-out task's
    answers are recorded one a group), with their task and a source naming both."""
    tasks = {t.task_id: t for t in load_tasks(split=split) if t.checks}
    files = RunFolder(run_dir).trajectory_files(RUN_SPLITS[split])
    if not files:
        raise agentrl.ConfigurationError(
            f"{run_dir} has no recorded {RUN_SPLITS[split]} trajectories: name a rubric run's folder "
            "(benchmarks.learning prints it under 'runs under')"
        )
    grouped: dict[tuple[str, str], list[agentrl.Trajectory]] = {}
    for file in files:
        for group in load_trajectories(file):
            for trajectory in group.trajectories:
                task_id = str(trajectory.metadata.get("task_id"))
                if task_id in tasks:
                    grouped.setdefault((file.stem, task_id), []).append(trajectory)
    return [(tasks[task_id], f"rubric {split} {stem} {task_id}", ts) for (stem, task_id), ts in grouped.items()]


def balanced_within_steps(verdicts: list[VerdictExample], per_label: int, seed: int = 0) -> list[VerdictExample]:
    """As `balanced`, but as many passing as failing verdicts from each recorded step, so that what a step's
    answers look like (early and long, late and short) says nothing about the label: only the check does."""
    rng = random.Random(seed)
    by_step: dict[str, list[int]] = {}
    for k, v in enumerate(verdicts):
        by_step.setdefault(v.source.split(" ")[2], []).append(k)
    pairs: list[tuple[int, int]] = []
    for indices in by_step.values():
        passing = [k for k in indices if verdicts[k].passed]
        failing = [k for k in indices if not verdicts[k].passed]
        rng.shuffle(passing)
        rng.shuffle(failing)
        pairs += zip(passing, failing)
    kept = {k for pair in rng.sample(pairs, min(per_label, len(pairs))) for k in pair}
    return [v for k, v in enumerate(verdicts) if k in kept]


def answer_of(trajectory: agentrl.Trajectory) -> str:
    return str(trajectory.messages()[-1].get("content") or "")


def write_from_run(run_dir: Path, out_dir: Path = DATA) -> dict[str, int]:
    """judge_policy_{split}.jsonl (RULER's examples: groups whose answers pass differently) and
    verdict_policy_{split}.jsonl (every answer and checkable rubric, balanced) in `out_dir` from a run's answers."""
    written = {}
    for split in ("train", "test"):
        examples, verdicts = [], []
        for task, source, trajectories in answers_from_run(run_dir, split):
            for trajectory in trajectories:  # the checks, whatever reward the run trained on
                trajectory.metrics["independent_reward"] = checked_pass_rate(task, answer_of(trajectory)) or 0.0
            group = agentrl.TrajectoryGroup(trajectories)
            examples += examples_from_groups([group], rubric=task_rubric(task), source=source)
            verdicts += [
                VerdictExample(
                    prompt=task.prompt,
                    response=answer_of(t),
                    rubric=rubric,
                    passed=passes(check, answer_of(t)),
                    source=f"{source} answer {number + 1}",
                )
                for number, t in enumerate(trajectories)
                for rubric, check in zip(task.rubrics, task.checks or [])
                if check is not None
            ]
        write_examples(out_dir / f"judge_policy_{split}.jsonl", examples)
        kept = balanced_within_steps(verdicts, VERDICTS_PER_LABEL[split])
        write_verdict_examples(out_dir / f"verdict_policy_{split}.jsonl", kept)
        written[split] = len(kept)
        print(
            f"{split}: {len(examples)} RULER examples, {len(kept)} of {len(verdicts)} verdicts "
            f"({sum(v.passed for v in kept)} passing) from {run_dir} -> {out_dir}/*_policy_{split}.jsonl"
        )
    return written


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
    write_verdicts()
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--answers", type=int, default=4, help="sampled answers per task")
    parser.add_argument("--max-tokens", type=int, default=96, help="as the CPU preset trains")
    parser.add_argument("--verdicts-only", action="store_true", help="rewrite the verdict files only, sampling nothing")
    parser.add_argument("--from-run", type=Path, help="a rubric run's folder: the *_policy_* files from its answers")
    args = parser.parse_args()
    if args.from_run:
        write_from_run(args.from_run)
    elif args.verdicts_only:
        write_verdicts()
    else:
        asyncio.run(make(args.answers, args.max_tokens))


if __name__ == "__main__":
    main()
