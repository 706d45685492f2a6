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

With `readout="probabilities"` both train the decision alone, as `ruler(..., readout="probabilities")`
reads it: each pair of attempts whose labels differ, in both orders, answered by one token (A or B).
SFT's loss is on that token only (no explanation, no end-of-turn token); RL samples that one token and
rewards agreement with the labels' order of the pair.

Check the result with `check_judge` on held-out examples (`JudgeExample.group`) before it judges a
policy. `agentrl judge train NAME --examples FILE` does both from the command line, and
`--judge run:NAME` then judges with it (`trained_judge`): another model on the policy's backend,
whose adapter stays at the step it was trained to.
"""

from __future__ import annotations

import json
import random
from typing import Any, cast

from agentrl.client.backend_protocol import TrainResult
from agentrl.client.model import TrainableModel
from agentrl.client.pipeline import train_pipelined
from agentrl.data.trajectory import History, Trajectory
from agentrl.data.trajectory_group import TrajectoryGroup
from agentrl.foundation.config import SFTConfig, TrainConfig
from agentrl.foundation.errors import ConfigurationError
from agentrl.judge_training.decisions import decision_choices, decision_histories, decision_rollout, ordered_pairs
from agentrl.judges.agreement import pair_counts
from agentrl.judges.call import InvalidJudgeAnswer, parse_json_object, response_format
from agentrl.judges.examples import JudgeExample
from agentrl.judges.readout import Readout, check_readout, refuse_json_settings
from agentrl.judges.ruler import ruler_prompt, scores_schema
from agentrl.judges.trained import record_readout


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


def _require(examples: list[JudgeExample]) -> None:
    if not examples:
        raise ConfigurationError(
            "no judge examples: build them with examples_from_groups from groups that kept a check "
            "(their attempts must score differently)"
        )


async def train_judge(
    judge: TrainableModel,
    examples: list[JudgeExample],
    config: SFTConfig | None = None,
    *,
    orders: int | None = None,
    seed: int = 0,
    readout: Readout = "json",
) -> TrainResult:
    """Teach a registered judge model (a `TrainableModel` on the policy's base model and backend) to
    score like the labels, by SFT on `judge_histories`; returns the SFT step's result.

    `readout="probabilities"`: SFT on the decision alone (`decision_histories`: every differing pair in
    both orders, the loss on its one answer token, shuffled with `seed`). `orders` (JSON only, default 2)
    is refused there with a `ConfigurationError`."""
    refuse_json_settings(check_readout(readout), orders=orders)
    _require(examples)
    record_readout(judge, readout)
    if readout == "probabilities":
        histories = decision_histories(examples, await decision_choices(judge))
        random.Random(seed).shuffle(histories)
    else:
        histories = judge_histories(examples, orders=2 if orders is None else orders, seed=seed)
    return await judge.train_sft(histories, config or SFTConfig())


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
    max_tokens: int | None = None,
    seed: int = 0,
    readout: Readout = "json",
) -> list[TrainResult]:
    """GRPO on the judge itself: each step, `examples_per_step` examples (walking through them from the
    judge's current step, each in a fresh shuffled order) answered `samples_per_example` times at
    temperature 1, rewarded by agreement with the labels; returns each step's result.

    `readout="probabilities"`: each example gives one pair whose labels differ, in a random order, and the
    judge samples its one-token decision (`decision_rollout`); `max_tokens` (JSON only, default 256) is
    refused there with a `ConfigurationError`."""
    refuse_json_settings(check_readout(readout), max_tokens=max_tokens)
    by_pairs = readout == "probabilities"
    examples = [e for e in examples if ordered_pairs(e)] if by_pairs else examples
    _require(examples)
    record_readout(judge, readout)

    def step_groups(judge: TrainableModel, step: int) -> list[TrajectoryGroup]:
        """Step `step`'s groups: it walks on from the judge's own step, so calls in a row see new examples."""
        batch = [examples[(step * examples_per_step + k) % len(examples)] for k in range(examples_per_step)]
        rng = random.Random(f"{seed}-{step}")
        if by_pairs:
            pairs = [rng.choice(ordered_pairs(e)) for e in batch]
            return [
                TrajectoryGroup(decision_rollout(judge, e, i, j) for _ in range(samples_per_example))
                for e, (i, j) in zip(batch, pairs)
            ]
        orders = [rng.sample(range(len(e.message_lists)), len(e.message_lists)) for e in batch]
        return [
            TrajectoryGroup(
                judge_rollout(judge, e, order, max_tokens=256 if max_tokens is None else max_tokens)
                for _ in range(samples_per_example)
            )
            for e, order in zip(batch, orders)
        ]

    return await train_pipelined(  # agentrl's one training loop, synchronous; no rollout may fail
        judge,
        step_groups,
        steps=steps,
        max_steps_off_policy=0,
        config=config or TrainConfig(learning_rate=1e-4),
        max_exception_rate=None,
    )
