"""The tool-use agent: answer a question whose answer only a tool's result gives, calling tools in "auto".

Each turn the model either calls tools (sampled under agentrl's tool-call grammar, so a call it opens is a
valid one) or answers in text, which ends the episode. The packaged 135M model never opens a call on its own in
"auto", so `demonstration()` gives correct conversations for a supervised warm start before RL, as the email
agent does; RL then works on what the demonstrations leave (two-step questions, using the result it got).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

import agentrl
from agentrl.data.tool_calls import unparsed_tool_calls

from .task import TOOLS, Call, Question, episode_of, execute, format_number, shaped_reward, succeeded

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam

SYSTEM_PROMPT = (
    "You are a careful assistant with tools. Never guess a number: call a tool for every sum, product, price "
    "or unit conversion the question needs, then give the tool's result in a short answer."
)
EVAL_CONCURRENCY = 32
REWARDS = ("shaped", "strict")


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
    train_questions: int = 400
    test_questions: int = 60


PRESETS = {
    "cpu": Preset(
        "smollm2-135m-instruct",
        max_turns=4,
        max_tokens=64,
        steps=20,
        groups_per_step=4,
        group_size=8,
        learning_rate=2e-4,
        sft_examples=60,
    ),
    "gpu": Preset(
        "Qwen/Qwen2.5-3B-Instruct",
        max_turns=6,
        max_tokens=256,
        steps=40,
        groups_per_step=16,
        group_size=8,
        learning_rate=1e-5,
        sft_examples=0,
        test_questions=200,
    ),
}


@agentrl.traced
async def rollout(
    model: agentrl.Model, question: Question, *, max_turns: int = 4, max_tokens: int = 64, reward: str = "shaped"
) -> agentrl.Trajectory:
    """Up to `max_turns` turns with `tool_choice="auto"`; the first text answer ends the episode."""
    client = model.openai_client()
    trajectory = agentrl.Trajectory(
        messages_and_choices=[
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": question.question},
        ],
        tools=TOOLS,
        metadata={"question_id": question.question_id},
    )
    for _ in range(max_turns):
        completion = await client.chat.completions.create(
            model=model.inference_name,
            messages=cast("list[ChatCompletionMessageParam]", trajectory.messages()),
            tools=cast("list[ChatCompletionToolParam]", TOOLS),
            tool_choice="auto",
            max_tokens=max_tokens,
            temperature=1.0,
        )
        choice = completion.choices[0]
        trajectory.messages_and_choices.append(choice)
        calls = [call for call in choice.message.tool_calls or [] if call.type == "function"]
        if not calls and not unparsed_tool_calls(choice.message.content):
            break  # the answer
        if not calls:  # a call cut off by max_tokens
            trajectory.messages_and_choices.append({"role": "user", "content": "That call was cut off. Try again."})
        for call in calls:
            result = execute(call.function.name, call.function.arguments, question.prices)
            trajectory.messages_and_choices.append({"role": "tool", "tool_call_id": call.id, "content": result.content})
    return score(trajectory, question, reward)


def score(trajectory: agentrl.Trajectory, question: Question, reward: str) -> agentrl.Trajectory:
    """Reward and metrics from what the trajectory records (`episode_of`), for this rollout or any agent's."""
    episode = episode_of(trajectory, question)
    success, shaped = succeeded(episode, question), shaped_reward(episode, question)
    trajectory.reward = float(success) if reward == "strict" else shaped
    trajectory.metadata["question_id"] = question.question_id
    trajectory.metrics.update(
        success=success,
        shaped_reward=shaped,
        tool_called=episode.attempted_calls > 0,
        attempted_calls=episode.attempted_calls,
        valid_calls=episode.valid_calls,
        answered=episode.answer is not None,
        turns=episode.turns,
    )
    if episode.attempted_calls:
        trajectory.metrics["valid_call_rate"] = episode.valid_calls / episode.attempted_calls
    trajectory.log(f"{question.kind}: expected {format_number(question.answer)}, answered {episode.answer!r}")
    return trajectory


def _call(call_id: str, call: Call) -> dict[str, object]:
    function = {"name": call.name, "arguments": json.dumps(call.arguments)}
    return {"id": call_id, "type": "function", "function": function}


def demonstration(question: Question) -> agentrl.History:
    """A correct conversation for `question`: each needed call in turn, its result, then the answer."""
    messages: list[dict[str, object]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": question.question},
    ]
    for number, call in enumerate(question.calls, 1):
        result = execute(call.name, json.dumps(call.arguments), question.prices)
        messages.append({"role": "assistant", "content": None, "tool_calls": [_call(f"call_{number}", call)]})
        messages.append({"role": "tool", "tool_call_id": f"call_{number}", "content": result.content})
    messages.append({"role": "assistant", "content": f"The answer is {format_number(question.answer)}."})
    return agentrl.History(messages_and_choices=messages, tools=TOOLS)


class AgentRollout(Protocol):
    """A rollout of the task: this module's `rollout`, or another agent's with the same keywords
    (`frameworks.program_rollout`)."""

    def __call__(
        self, model: Any, question: Question, *, max_turns: int, max_tokens: int, reward: str
    ) -> Awaitable[agentrl.Trajectory]: ...


async def evaluate(
    model: agentrl.Model, test: list[Question], preset: Preset, agent: AgentRollout = rollout
) -> list[agentrl.Trajectory]:
    """One attempt per held-out question, strict reward, at most `EVAL_CONCURRENCY` at once."""
    limited = agentrl.limit_concurrency(EVAL_CONCURRENCY)(agent)
    return await agentrl.gather_trajectories(
        (limited(model, q, max_turns=preset.max_turns, max_tokens=preset.max_tokens, reward="strict") for q in test),
        max_exception_rate=0.1,
        desc=f"eval {model.inference_name}",
    )
