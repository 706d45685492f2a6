"""A judge you train: labelled judgements from any task that has a check, and a RULER judge adapter
taught on them with agentrl's own SFT, on the same base model and backend as the policy.

Data: JSONL, one `JudgeExample` a line: the attempts at one task (message lists, as RULER shows them)
and each attempt's label (the verifiable reward: a code check, a checked answer). Any recorded run
whose groups kept a check makes them (`examples_from_groups`; a RULER run keeps it as
`independent_reward`). Two ways to teach, used alone or one after the other:

- SFT (`train_judge`): each example in several shuffled orders, answered with RULER's JSON and the
  labels as the scores, so what the judge learns is the attempts, not their positions.
- RL on agreement (`train_judge_rl`): the judge answers shuffled examples itself (sampled, in RULER's
  constrained format) and GRPO rewards each answer by how many of the label's pairs it orders the
  same way, so the reward sits on the decision and not on the format.

Check the result with `check_judge` on held-out examples (`JudgeExample.group`) before it judges a
policy. `agentrl judge train NAME --examples FILE` does both from the command line, and
`--judge run:NAME` then judges with it (`trained_judge`): another model on the policy's backend,
whose adapter stays at the step it was trained to.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentrl.errors import ConfigurationError
from agentrl.files import write_text_atomic
from agentrl.judges.agreement import pair_counts
from agentrl.judges.call import InvalidJudgeAnswer, parse_json_object, response_format
from agentrl.judges.check import reference_reward
from agentrl.judges.ruler import DEFAULT_RUBRIC, ruler_prompt, scores_schema
from agentrl.trajectory import History, Trajectory, TrajectoryGroup

if TYPE_CHECKING:
    from agentrl.config import SFTConfig, TrainConfig
    from agentrl.model import TrainableModel, TrainResult
    from agentrl.runs import RunInfo

JUDGE_PROJECT = "judges"
"""Where `agentrl judge train` keeps judge runs ({base_path}/judges/NAME)."""
RUN_PREFIX = "run:"
"""`--judge run:NAME` (or run:PROJECT/NAME): a judge trained with agentrl."""


class JudgeExample(BaseModel):
    """One labelled judgement: attempts at one task and the score each deserves (its check)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    message_lists: list[list[dict[str, Any]]] = Field(min_length=2)
    """The attempts, each the messages RULER would show (shared context first)."""
    labels: list[float]
    """The verifiable reward of each attempt, in [0, 1]: what the judge should score."""
    rubric: str = DEFAULT_RUBRIC
    tools: list[dict[str, Any]] | None = None
    source: str = ""
    """Where it came from (run and step), for the record."""

    def model_post_init(self, _: Any) -> None:
        if len(self.labels) != len(self.message_lists):
            raise ValueError(f"{len(self.labels)} labels for {len(self.message_lists)} attempts: give one each")
        if any(not 0.0 <= label <= 1.0 for label in self.labels):
            raise ValueError(f"labels must lie in [0, 1] (RULER's scale), got {self.labels}")

    def group(self) -> TrajectoryGroup:
        """The attempts as a group with the labels as rewards and the rubric in its metadata, as
        `check_judge` takes it (held-out examples measure a judge)."""
        return TrajectoryGroup(
            (
                Trajectory(messages_and_choices=list(m), reward=label, tools=self.tools)
                for m, label in zip(self.message_lists, self.labels)
            ),
            metadata={"rubric": self.rubric},
        )


def examples_from_groups(
    groups: list[TrajectoryGroup], *, rubric: str = DEFAULT_RUBRIC, source: str = ""
) -> list[JudgeExample]:
    """Judge examples from groups that kept a verifiable reward (`independent_reward`, else `reward`),
    clipped to [0, 1]; groups whose attempts all score alike teach no ordering and are left out."""
    examples = []
    for group in groups:
        labels = [min(max(reference_reward(t), 0.0), 1.0) for t in group.trajectories]
        if len(labels) < 2 or len(set(labels)) < 2:
            continue
        message_lists = [t.messages() for t in group.trajectories]
        tools = group.trajectories[0].tools
        examples.append(
            JudgeExample(message_lists=message_lists, labels=labels, rubric=rubric, tools=tools, source=source)
        )
    return examples


def write_examples(path: str | Path, examples: list[JudgeExample]) -> Path:
    """Write examples as JSONL, atomically."""
    path = Path(path)
    write_text_atomic(path, "".join(e.model_dump_json() + "\n" for e in examples))
    return path


def load_examples(path: str | Path) -> list[JudgeExample]:
    """Read a JSONL of examples; a bad line raises `ValueError` naming its file and line number."""
    examples = []
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            examples.append(JudgeExample.model_validate_json(line))
        except ValidationError as error:
            raise ValueError(f"{path}:{number}: not a judge example: {error}") from error
    return examples


def judgement_history(example: JudgeExample, order: list[int]) -> History:
    """The RULER prompt with the attempts shown in `order`, answered with their labels as the scores."""
    shown = [example.message_lists[i] for i in order]
    ranks = sorted(range(len(order)), key=lambda k: -example.labels[order[k]])
    answer = {
        f"trajectory_{k + 1}": {
            "explanation": f"rank {ranks.index(k) + 1} of {len(order)}",
            "score": round(example.labels[i], 3),
        }
        for k, i in enumerate(order)
    }
    messages = ruler_prompt(shown, example.rubric, example.tools)
    # Compact, as our server's constrained decoder lets the judge write it (`server.STRUCTURED_OUTPUTS`).
    content = json.dumps(answer, separators=(",", ":"))
    return History(messages_and_choices=[*messages, {"role": "assistant", "content": content}])


def judge_histories(examples: list[JudgeExample], *, orders: int = 2, seed: int = 0) -> list[History]:
    """Each example shown in `orders` orders (its own first, then shuffles): the demonstrations a judge learns
    from, so that its scores follow the attempts and not where they stand."""
    rng = random.Random(seed)
    histories = []
    for example in examples:
        size = len(example.message_lists)
        for k in range(orders):
            order = list(range(size))
            if k:
                rng.shuffle(order)
            histories.append(judgement_history(example, order))
    return histories


async def train_judge(
    judge: TrainableModel,
    examples: list[JudgeExample],
    config: SFTConfig | None = None,
    *,
    orders: int = 2,
    seed: int = 0,
) -> TrainResult:
    """Teach a registered judge model (a `TrainableModel` on the policy's base model and backend) to
    score like the labels, by SFT on `judge_histories`; returns the SFT step's result."""
    from agentrl.config import SFTConfig

    if not examples:
        raise ValueError(
            "no judge examples: build them with examples_from_groups from groups that kept a check "
            "(their attempts must score differently)"
        )
    return await judge.train_sft(judge_histories(examples, orders=orders, seed=seed), config or SFTConfig())


def agreement_reward(labels: list[float], scores: list[float]) -> float:
    """The share of the pairs the labels order strictly that the scores order the same way (a tie
    counts half): 1 for a judge that agrees, 0.5 for one that ties everything."""
    counts = pair_counts(labels, scores)
    return counts.credit / counts.pairs if counts.pairs else 0.5


async def judge_rollout(
    judge: TrainableModel, example: JudgeExample, order: list[int], *, max_tokens: int = 256
) -> Trajectory:
    """The judge answers `example` shown in `order`, sampled in RULER's JSON schema; reward: its
    `agreement_reward` with the labels (0 for an answer that does not parse, e.g. cut off)."""
    shown = [example.message_lists[i] for i in order]
    messages = ruler_prompt(shown, example.rubric, example.tools)
    trajectory = Trajectory(messages_and_choices=list(messages))
    completion = await judge.openai_client().chat.completions.create(
        model=judge.inference_name,
        messages=cast(Any, messages),
        max_tokens=max_tokens,
        temperature=1.0,
        response_format=cast(Any, response_format(scores_schema(len(order)), bound_lengths=True)),
    )
    choice = completion.choices[0]
    trajectory.messages_and_choices.append(choice)
    labels = [example.labels[i] for i in order]
    try:
        answer = scores_schema(len(order)).model_validate(parse_json_object(choice.message.content or ""))
        scores = [float(getattr(answer, f"trajectory_{k}").score) for k in range(1, len(order) + 1)]
    except (InvalidJudgeAnswer, ValueError):
        trajectory.reward, trajectory.metrics["judge_answer_parsed"] = 0.0, 0.0
        return trajectory
    trajectory.reward = agreement_reward(labels, scores)
    trajectory.metrics["judge_answer_parsed"] = 1.0
    return trajectory


async def train_judge_rl(
    judge: TrainableModel,
    examples: list[JudgeExample],
    config: TrainConfig | None = None,
    *,
    steps: int = 4,
    examples_per_step: int = 8,
    samples_per_example: int = 4,
    max_tokens: int = 256,
    seed: int = 0,
) -> list[TrainResult]:
    """GRPO on the judge itself: each step, `examples_per_step` examples (walking through them from the
    judge's current step, each in a fresh shuffled order) answered `samples_per_example` times at
    temperature 1, rewarded by agreement with the labels; returns each step's result."""
    from agentrl.config import TrainConfig
    from agentrl.gather import gather_trajectory_groups

    if not examples:
        raise ValueError("no judge examples to train on (see examples_from_groups)")
    results = []
    first = await judge.get_step()  # walk on from the judge's own step: calls in a row see new examples
    for step in range(first, first + steps):
        batch = [examples[(step * examples_per_step + k) % len(examples)] for k in range(examples_per_step)]
        rng = random.Random(f"{seed}-{step}")
        orders = [rng.sample(range(len(e.message_lists)), len(e.message_lists)) for e in batch]
        groups = await gather_trajectory_groups(
            [
                TrajectoryGroup(
                    judge_rollout(judge, e, order, max_tokens=max_tokens) for _ in range(samples_per_example)
                )
                for e, order in zip(batch, orders)
            ],
            desc=f"judge RL step {step + 1}",
        )
        results.append(await judge.train(groups, config or TrainConfig(learning_rate=1e-4)))
    return results


def trained_judge_run(spec: str, base_path: str | Path) -> tuple[RunInfo, dict[str, Any]]:
    """The run `run:NAME` (run:PROJECT/NAME, or run:FOLDER) names and its latest checkpoint's adapter
    config; `ConfigurationError` when there is no such run or it was never trained."""
    from agentrl.backend.checkpoints import CheckpointStore
    from agentrl.runs import resolve_run

    project, _, name = spec.removeprefix(RUN_PREFIX).rpartition("/")
    info = resolve_run(f"{project or JUDGE_PROJECT}/{name}", base_path)
    if not info.steps or info.steps[-1] == 0:
        raise ConfigurationError(
            f"judge run {info.label} has no trained checkpoint (steps {info.steps or 'none'}); "
            f"train it first: agentrl judge train {name} --examples FILE"
        )
    adapter = CheckpointStore(info.path).adapter_config(info.steps[-1])
    return info, adapter


def check_same_base_model(info: RunInfo, adapter: dict[str, Any], base_model: str) -> None:
    """A judge adapter is served beside the policy, so both must sit on one base model (an adapter
    that does not record its base model, from before agentrl recorded it, is taken on trust)."""
    recorded = adapter.get("base_model_name_or_path")
    trained_on = Path(str(recorded)).name
    if recorded and trained_on != Path(base_model).name:
        raise ConfigurationError(
            f"judge run {info.label} was trained on base model {trained_on!r}; the policy's is {base_model!r}. "
            "A judge is served beside the policy on one base model: train the judge on the policy's"
        )


def trained_judge(spec: str, *, base_path: str | Path, base_model: str) -> TrainableModel:
    """The judge `--judge run:NAME` names (run:PROJECT/NAME; project "judges" by default): its run as a
    `TrainableModel` with the adapter's own shape. Register it on the policy's backend, where it is
    served at its latest checkpoint; nothing trains it there, so its judgements stay those it was checked at."""
    from agentrl.config import LoRAConfig
    from agentrl.model import TrainableModel

    info, adapter = trained_judge_run(spec, base_path)
    check_same_base_model(info, adapter, base_model)
    lora = LoRAConfig(
        rank=int(adapter["r"]),
        alpha=int(adapter["lora_alpha"]),
        dropout=float(adapter.get("lora_dropout") or 0.0),
        target_modules=tuple(sorted(adapter["target_modules"])),
    )
    return TrainableModel(
        name=info.path.name,
        project=info.path.parent.name,
        base_path=str(info.path.parent.parent),
        base_model=base_model,
        lora=lora,
    )
