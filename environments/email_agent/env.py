"""The email agent (ART-E style): answer a question about an inbox by searching and reading it.

Tool calls use the Hermes format (`<tool_call>{"name": ..., "arguments": ...}</tool_call>`), which
agentrl's chat template for the packaged model describes and vLLM's `hermes` parser reads: the
packaged model's own template has no tool format at all, and Hermes tags are plain text a small
model can learn to write. The 135M model rarely calls a tool on its own, so RL gets little signal;
`demonstrations()` builds correct tool-using conversations from the data for a supervised warm
start (`model.train_sft`) before RL.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import agentrl
from agentrl import JudgeModel
from agentrl.foundation.base_models import cache_dir

from .data import Dataset, Question, generate
from .grading import RolloutStats, answer_is_correct, grade_answer, reward
from .mailbox import Mailbox, build_database
from .tools import TOOLS, execute

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam


DATA_VERSION = 2  # 2: 40 inboxes (108 held-out questions), was 8
SYSTEM_PROMPT = (
    "You are an email assistant with tools to search and read the user's inbox. Answer the question by "
    "searching for emails, reading the right one, and calling return_final_answer with a short answer and "
    'the message ids you used. If the inbox does not tell, answer "I don\'t know".'
)
EVAL_CONCURRENCY = 32
"""108 held-out rollouts at once overloaded a 2-core server past its 180 s request timeout; 32 keep it busy."""
RETRY_PROMPT = "Call exactly one tool, inside <tool_call></tool_call> tags, as the system prompt shows."


@dataclass(frozen=True)
class EmailEnvironment:
    """The generated data and its SQLite database (built once per seed and cached)."""

    data: Dataset
    database: Path

    @classmethod
    def load(cls, *, seed: int = 0) -> EmailEnvironment:
        data = generate(seed=seed)
        database = cache_dir() / "email_agent" / f"inboxes-v{DATA_VERSION}-seed{seed}.sqlite"
        if not database.exists():
            build_database(data, database)
        return cls(data, database)


@dataclass(frozen=True)
class Preset:
    base_model: str
    max_turns: int
    max_tokens: int
    steps: int
    groups_per_step: int
    group_size: int
    learning_rate: float
    sft_examples: int  # demonstrations for the warm start (0 = none)


PRESETS = {
    "cpu": Preset(
        "smollm2-135m-instruct",
        max_turns=4,
        max_tokens=96,
        steps=6,
        groups_per_step=4,
        group_size=4,
        learning_rate=2e-4,
        sft_examples=48,
    ),
    "gpu": Preset(
        "Qwen/Qwen2.5-3B-Instruct",
        max_turns=10,
        max_tokens=512,
        steps=100,
        groups_per_step=12,
        group_size=8,
        learning_rate=1e-5,
        sft_examples=0,
    ),
}


@agentrl.traced
async def rollout(
    model: agentrl.Model,
    question: Question,
    env: EmailEnvironment,
    *,
    max_turns: int = 4,
    max_tokens: int = 96,
    judge: JudgeModel | None = None,
) -> agentrl.Trajectory:
    """Up to `max_turns` tool-calling turns against the question's inbox; `judge` grades free-text answers."""
    client = model.openai_client()
    mailbox = Mailbox(env.database, question.inbox)
    trajectory = agentrl.Trajectory(
        messages_and_choices=[
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": question.question},
        ],
        tools=TOOLS,
        metadata={"question_id": question.question_id, "inbox": question.inbox},
    )
    stats = RolloutStats()
    try:
        while stats.turns < max_turns and stats.answer is None:
            stats.turns += 1
            completion = await client.chat.completions.create(
                model=model.inference_name,
                messages=cast("list[ChatCompletionMessageParam]", trajectory.messages()),
                tools=cast("list[ChatCompletionToolParam]", TOOLS),
                max_tokens=max_tokens,
                temperature=1.0,
            )
            choice = completion.choices[0]
            trajectory.messages_and_choices.append(choice)
            calls = choice.message.tool_calls or []
            if not calls:  # prose, or a <tool_call> the parser could not read
                stats.malformed_calls += 1
                trajectory.messages_and_choices.append({"role": "user", "content": RETRY_PROMPT})
                continue
            for call in calls:
                if call.type != "function":  # a custom (free-form) tool call: none of this agent's tools
                    stats.malformed_calls += 1
                    continue
                outcome = execute(mailbox, call.function.name, call.function.arguments)
                trajectory.messages_and_choices.append(
                    {"role": "tool", "tool_call_id": call.id, "content": outcome.content}
                )
                stats.malformed_calls += outcome.malformed
                stats.found_source |= bool(set(outcome.found_ids) & set(question.source_ids))
                stats.read_source |= outcome.read_id in question.source_ids
                if outcome.final_answer is not None:
                    stats.answer, stats.sources = outcome.final_answer, outcome.sources
    finally:
        mailbox.close()
    if stats.answer is not None:
        stats.correct = await grade_answer(stats.answer, question, judge)
    trajectory.reward = reward(stats, question, max_turns)
    trajectory.metrics.update(
        correct=stats.correct,
        exact_match=stats.answer is not None and answer_is_correct(stats.answer, question.answer),
        answered=stats.answer is not None,
        turns=stats.turns,
        malformed_calls=stats.malformed_calls,
        valid_tool_call_rate=1 - stats.malformed_calls / max(stats.turns, 1),
        found_source=stats.found_source,
        read_source=stats.read_source,
    )
    return trajectory


def _keywords(question: str) -> str:
    """The capitalised or numeric words of a question: the names a person would search for."""
    words = re.findall(r"[A-Z][a-zA-Z]+|\d+", question)
    return " ".join(w for w in words if w not in {"When", "How", "What", "Which", "Who"}) or question


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def demonstration(question: Question, env: EmailEnvironment) -> agentrl.History:
    """A correct conversation for `question`: search, read the source, answer citing it."""
    mailbox = Mailbox(env.database, question.inbox)
    try:
        keywords = _keywords(question.question)
        search = execute(mailbox, "search_emails", json.dumps({"keywords": keywords}))
        source = question.source_ids[0]
        read = execute(mailbox, "read_email", json.dumps({"message_id": source}))
    finally:
        mailbox.close()
    messages = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": question.question},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [_call("call_1", "search_emails", {"keywords": keywords})],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": search.content},
        {"role": "assistant", "content": None, "tool_calls": [_call("call_2", "read_email", {"message_id": source})]},
        {"role": "tool", "tool_call_id": "call_2", "content": read.content},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [_call("call_3", "return_final_answer", {"answer": question.answer, "sources": [source]})],
        },
        {"role": "tool", "tool_call_id": "call_3", "content": "Answer recorded."},
    ]
    return agentrl.History(messages_and_choices=messages, tools=TOOLS)


async def evaluate(
    model: agentrl.Model, questions: list[Question], env: EmailEnvironment, preset: Preset
) -> list[agentrl.Trajectory]:
    """One attempt per held-out question, at most `EVAL_CONCURRENCY` at once."""
    limited = agentrl.limit_concurrency(EVAL_CONCURRENCY)(rollout)
    return await agentrl.gather_trajectories(
        (limited(model, q, env, max_turns=preset.max_turns, max_tokens=preset.max_tokens) for q in questions),
        max_exception_rate=0.1,
        desc=f"eval {model.inference_name}",
    )
