"""RULER read from probabilities: every pair of a group compared in both orders, one token each.

For attempts i and j the judge is asked "which is better, A or B?" with i shown as A and j as B, then
again with the two swapped; i's preference over j is the mean of P(A) in the first call and P(B) in the
second, so a judge's taste for the first position cancels (and is measured: `first_position_rate`).
Each attempt's score is its mean preference over the others, in [0, 1]. A group of G attempts costs
G(G-1) one-token calls with short prompts that share their beginning (a vLLM server caches it).
"""

from __future__ import annotations

import asyncio
import itertools
import json
from dataclasses import dataclass
from typing import Any

from agentrl.client.model import JudgeModel
from agentrl.judges.call import JudgeLimiter
from agentrl.judges.readout import DecisionCall, decision_call

PAIR_INSTRUCTIONS = """\
You are an impartial judge. Two AI agents attempted the same task: attempt A and attempt B.
Compare them against the rubric and answer with one letter: A if attempt A is better, B if attempt B is better."""
ANSWERS = ("A", "B")
"""The judge's one-token answers: the first attempt shown, the second."""


def common_prefix_length(message_lists: list[list[dict[str, Any]]]) -> int:
    """How many leading messages every list shares."""
    shortest = min(len(m) for m in message_lists)
    for index in range(shortest):
        if any(m[index] != message_lists[0][index] for m in message_lists[1:]):
            return index
    return shortest


def split_context(message_lists: list[list[dict[str, Any]]]) -> tuple[list[dict[str, Any]], list[list[dict[str, Any]]]]:
    """The messages every attempt shares (the task), and each attempt's own messages after them."""
    shared = common_prefix_length(message_lists)
    return message_lists[0][:shared], [m[shared:] for m in message_lists]


def render_plain(messages: list[dict[str, Any]]) -> str:
    """Messages as "role: text" lines (tool calls as their JSON): fewer tokens than RULER's JSON lines,
    so a small judge reads the attempts and not the quoting."""
    lines = []
    for message in messages:
        content = message.get("content")
        text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False) if content else ""
        if message.get("tool_calls"):
            text = f"{text} {json.dumps(message['tool_calls'], ensure_ascii=False)}".strip()
        lines.append(f"{message.get('role', 'user')}: {text}")
    return "\n".join(lines)


def pair_prompt(
    context: list[dict[str, Any]],
    first: list[dict[str, Any]],
    second: list[dict[str, Any]],
    rubric: str,
    tools: list[dict[str, Any]] | None,
) -> list[dict[str, str]]:
    """The judge's messages for one ordered pair: the shared context once, attempt A, attempt B, the rubric."""
    parts = [f"<context>\n{render_plain(context)}\n</context>"]
    if tools:
        parts.append(f"<tools>\n{json.dumps(tools, ensure_ascii=False)}\n</tools>")
    parts.append(f'<attempt id="A">\n{render_plain(first)}\n</attempt>')
    parts.append(f'<attempt id="B">\n{render_plain(second)}\n</attempt>')
    parts.append(f"<rubric>\n{rubric}\n</rubric>")
    parts.append("Which attempt is better? Answer A or B.")
    return [{"role": "system", "content": PAIR_INSTRUCTIONS}, {"role": "user", "content": "\n".join(parts)}]


@dataclass(frozen=True)
class PairwiseJudgement:
    """A group judged pair by pair: scores aligned with the attempts, what the order of each pair did, the calls."""

    scores: list[float]
    flip_rate: float
    """Pairs whose winner changed when the two attempts swapped places (0 for a judge that reads them)."""
    first_position_rate: float
    """Calls the attempt shown first won (chance: 0.5)."""
    calls: list[DecisionCall]


def _side(preference: float) -> int:
    return (preference > 0.5) - (preference < 0.5)


async def judge_pairs(
    message_lists: list[list[dict[str, Any]]],
    judge_model: JudgeModel,
    *,
    rubric: str,
    tools: list[dict[str, Any]] | None = None,
    limiter: JudgeLimiter | None = None,
    max_attempts: int = 3,
    extra_litellm_params: dict[str, Any] | None = None,
) -> PairwiseJudgement:
    """Every pair of distinct attempts (`message_lists`, shown as their shared context and each one's own
    messages) in both orders. Raises JudgeError when a call fails, NoLogprobs when the judge returns none."""
    context, attempts = split_context(message_lists)
    size = len(attempts)
    pairs = [(i, j) for i, j in itertools.permutations(range(size), 2) if attempts[i] != attempts[j]]

    async def ask(i: int, j: int) -> DecisionCall:
        return await decision_call(
            judge_model,
            pair_prompt(context, attempts[i], attempts[j], rubric, tools),
            ANSWERS,
            limiter=limiter,
            max_attempts=max_attempts,
            extra_litellm_params=extra_litellm_params,
        )

    calls = await asyncio.gather(*(ask(i, j) for i, j in pairs))
    first_wins = {pair: call.probabilities["A"] for pair, call in zip(pairs, calls)}  # P(shown first is better)
    preference_GG = [[0.5] * size for _ in range(size)]  # [i][j]: i over j, both orders averaged; 0.5 if identical
    flips = []
    for i, j in pairs:
        if i < j:
            as_first, as_second = first_wins[(i, j)], 1.0 - first_wins[(j, i)]
            preference_GG[i][j] = (as_first + as_second) / 2
            preference_GG[j][i] = 1.0 - preference_GG[i][j]
            flips.append(_side(as_first) != _side(as_second))
    scores_G = [sum(preference_GG[i][j] for j in range(size) if j != i) / max(size - 1, 1) for i in range(size)]
    return PairwiseJudgement(
        scores=scores_G,
        flip_rate=sum(flips) / len(flips) if flips else 0.0,
        first_position_rate=sum(p > 0.5 for p in first_wins.values()) / len(first_wins) if first_wins else 0.0,
        calls=list(calls),
    )
