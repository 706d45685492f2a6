"""How an email rollout is graded: whether an answer gives the question's fact (a normalised match, or an
LLM judge's yes/no for free text), and the shaped reward over what the rollout did."""

from __future__ import annotations

import re
from dataclasses import dataclass

import agentrl
from agentrl import JudgeModel

from .data import Question


def normalise(text: str) -> str:
    """Lowercase letters and digits only: "$4,250" and "4250" compare equal."""
    return re.sub(r"[^a-z0-9]", "", text.lower())


def answer_is_correct(answer: str, expected: str) -> bool:
    return bool(normalise(expected)) and normalise(expected) in normalise(answer)


async def grade_answer(answer: str, question: Question, judge: JudgeModel | None = None) -> bool:
    """Whether `answer` gives the question's fact: a normalised match, or else (with `judge`, for
    free-text answers such as "it moved to half past three") an LLM judge's yes/no via litellm.

    A judge that cannot answer raises `JudgeError`: the rollout fails and is counted, never scored."""
    if answer_is_correct(answer, question.answer):
        return True
    if judge is None or is_dont_know(answer):
        return False
    judgement = await agentrl.judge_rubrics(
        question.question,
        answer,
        [f"The response gives this fact, in any wording: {question.answer}"],
        judge,
        extra_litellm_params={"max_tokens": 256},
    )
    return judgement.verdicts[0].passed


def is_dont_know(answer: str) -> bool:
    return bool(re.search(r"\b(i\s*)?(don'?t|do not)\s+know\b", answer.lower()))


@dataclass
class RolloutStats:
    """What happened in one rollout, for the reward and the metrics."""

    turns: int = 0
    malformed_calls: int = 0
    found_source: bool = False
    read_source: bool = False
    answer: str | None = None
    sources: tuple[str, ...] = ()
    correct: bool = False  # decided by grade_answer once the rollout ends


def reward(stats: RolloutStats, question: Question, max_turns: int) -> float:
    """Correct answers score about 1 (more with the right sources and fewer turns); "I don't know"
    scores 0.3, above any wrong answer; finding and reading the right email earn partial credit;
    each malformed tool call costs 0.05."""
    partial = 0.1 * stats.found_source + 0.1 * stats.read_source
    if stats.answer is not None and stats.correct:
        cited = bool(set(stats.sources) & set(question.source_ids))
        value = 1.0 + 0.1 * cited + 0.1 * (1 - stats.turns / max_turns)
    elif stats.answer is not None and is_dont_know(stats.answer):
        value = 0.3 + partial
    else:  # a wrong answer, or none before the turns ran out
        value = partial
    return max(0.0, value - 0.05 * stats.malformed_calls)
