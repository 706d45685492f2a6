"""The judge's decision alone as training data: every pair of attempts whose labels differ, in both orders,
answered by one token (A or B), as `ruler(..., readout="probabilities")` reads a judge (`agentrl.judges.pairwise`).

SFT demonstrations carry exactly the token id the judge's server emits for each answer (`decision_choices`),
so their loss falls on that token alone; RL samples the one token and rewards agreement with the labels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from agentrl.data.trajectory import History, Trajectory
from agentrl.foundation.errors import ConfigurationError
from agentrl.judges.examples import JudgeExample
from agentrl.judges.pairwise import ANSWERS, pair_prompt, split_context

if TYPE_CHECKING:
    from openai.types.chat.chat_completion import Choice

    from agentrl.client.model import TrainableModel


def ordered_pairs(example: JudgeExample) -> list[tuple[int, int]]:
    """The (first shown, second shown) pairs of attempts whose labels differ, each pair in both orders."""
    labels = example.labels
    size = len(labels)
    return [(i, j) for i in range(size) for j in range(size) if i != j and labels[i] != labels[j]]


def pair_messages(example: JudgeExample, first: int, second: int) -> list[dict[str, str]]:
    """The pairwise judge's prompt with attempt `first` shown as A and `second` as B (`pairwise.pair_prompt`)."""
    context, own = split_context(example.message_lists)
    return pair_prompt(context, own[first], own[second], example.rubric, example.tools)


def better_answer(example: JudgeExample, first: int, second: int) -> str:
    """What the labels say the pairwise judge should answer: A when the attempt shown first is better."""
    return ANSWERS[0] if example.labels[first] > example.labels[second] else ANSWERS[1]


async def decision_choices(judge: TrainableModel, answers: tuple[str, ...] = ANSWERS) -> dict[str, Choice]:
    """Each of `answers` (A and B; Yes and No for a rubric judge) as the judge's server samples it (decoding
    forced to that answer, one token), so a
    demonstration carries exactly the token id the judge emits, and the loss falls on it alone. A ConfigurationError
    when an answer is not one token of the judge's tokenizer (its probability could not be read from one token)."""
    found = {}
    for answer in answers:
        completion = await judge.openai_client().chat.completions.create(
            model=judge.inference_name,
            messages=[{"role": "user", "content": f"Answer {answer}."}],
            max_tokens=1,
            temperature=0.0,
            extra_body={"structured_outputs": {"choice": [answer]}},
        )
        choice = completion.choices[0]
        if (choice.message.content or "") != answer:
            raise ConfigurationError(
                f"the judge's tokenizer does not spell the answer {answer!r} in one token (it gave "
                f"{choice.message.content!r}); read this judge's decisions from JSON: readout='json'"
            )
        found[answer] = choice
    return found


def decision_histories(examples: list[JudgeExample], choices: dict[str, Choice]) -> list[History]:
    """Every ordered pair of every example (`ordered_pairs`), answered by its one decision token (`choices`)."""
    return [
        History(messages_and_choices=[*pair_messages(e, i, j), choices[better_answer(e, i, j)]])
        for e in examples
        for i, j in ordered_pairs(e)
    ]


async def decision_rollout(judge: TrainableModel, example: JudgeExample, first: int, second: int) -> Trajectory:
    """The pairwise judge samples its one-token decision on `first` (A) against `second` (B) at temperature 1;
    reward 1 when it is the answer the labels give (`better_answer`), else 0 (the other letter, or no letter)."""
    messages = pair_messages(example, first, second)
    trajectory = Trajectory(messages_and_choices=list(messages))
    completion = await judge.openai_client().chat.completions.create(
        model=judge.inference_name, messages=cast(Any, messages), max_tokens=1, temperature=1.0
    )
    choice = completion.choices[0]
    trajectory.messages_and_choices.append(choice)
    trajectory.reward = float((choice.message.content or "").strip() == better_answer(example, first, second))
    return trajectory
