"""The tool-use environment's world and rewards, on trajectories written by hand: a success needs the right
number in the answer and this episode's own call of the right tool returning it."""

from __future__ import annotations

import json

import pytest

import agentrl
from agentrl_environments.tool_use.env import SYSTEM_PROMPT, demonstration
from agentrl_environments.tool_use.task import (
    KINDS,
    TOOLS,
    episode_of,
    execute,
    numbers_in,
    questions,
    shaped_reward,
    succeeded,
)
from tests.helpers import make_choice

QUESTIONS = {q.kind: q for q in questions("test", len(KINDS))}


def call(call_id: str, name: str, **arguments: object) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def trajectory(question, *turns: dict) -> agentrl.Trajectory:
    """The question's conversation with the given assistant and tool turns."""
    opening = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question.question}]
    return agentrl.Trajectory(messages_and_choices=[*opening, *turns], tools=TOOLS)


def scored(t: agentrl.Trajectory, question) -> tuple[bool, float]:
    episode = episode_of(t, question)
    return succeeded(episode, question), shaped_reward(episode, question)


def test_questions_are_seeded_their_splits_disjoint_and_their_answers_the_last_calls_result():
    assert questions("train", 20) == questions("train", 20)
    # Another seed: a held-out question may share a training question's words, not its hidden numbers.
    trained = {(q.question, q.answer) for q in questions("train", 400)}
    assert not trained & {(q.question, q.answer) for q in questions("test", 60)}
    for question in questions("train", 50):
        last = question.calls[-1]
        assert execute(last.name, json.dumps(last.arguments), question.prices).value == question.answer


@pytest.mark.parametrize("kind", KINDS)
def test_a_demonstration_succeeds_and_earns_the_full_reward(kind):
    question = QUESTIONS[kind]
    demo = demonstration(question)
    assert scored(agentrl.Trajectory(messages_and_choices=demo.messages_and_choices, tools=TOOLS), question) == (
        True,
        1.0,
    )


def test_the_right_number_without_the_tools_result_is_not_a_success():
    question = QUESTIONS["multiply"]  # a guess that happens to be right still earns only the answering credit
    guessed = trajectory(question, {"role": "assistant", "content": f"It is {question.answer:.0f}."})
    assert scored(guessed, question) == (False, pytest.approx(0.1))


def test_a_call_whose_result_is_not_used_earns_partial_credit():
    question = QUESTIONS["add"]
    a, b = question.calls[0].arguments.values()
    made = call("c1", "add", a=b, b=a)  # either order
    ignored = trajectory(
        question,
        {"role": "assistant", "content": None, "tool_calls": [made]},
        {"role": "tool", "tool_call_id": "c1", "content": str(a + b)},
        {"role": "assistant", "content": "The answer is 12."},
    )
    assert scored(ignored, question) == (False, pytest.approx(0.4 + 0.1 + 0.1))
    used = ignored.model_copy(deep=True)
    used.messages_and_choices[-1] = {"role": "assistant", "content": f"The sum is {a + b:,}."}  # "1,234" reads
    assert scored(used, question) == (True, 1.0)


def test_a_two_step_cost_needs_both_calls_and_the_wrong_tool_fails():
    question = QUESTIONS["cost"]
    lookup, multiply = question.calls
    price = question.prices[lookup.arguments["item"]]
    halfway = trajectory(
        question,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [call("c1", "lookup_price", item=lookup.arguments["item"] + "s")],
        },
        {"role": "tool", "tool_call_id": "c1", "content": str(price)},
        {"role": "assistant", "content": f"One costs {price}."},
    )
    assert scored(halfway, question) == (False, pytest.approx(0.2 + 0.1 + 0.1))
    wrong_tool = trajectory(  # the right number, from add: not the tool the question needs
        question,
        {"role": "assistant", "content": None, "tool_calls": [call("c1", "add", a=int(question.answer) - 1, b=1)]},
        {"role": "tool", "tool_call_id": "c1", "content": f"{question.answer:.0f}"},
        {"role": "assistant", "content": f"{question.answer:.0f} dollars."},
    )
    assert not scored(wrong_tool, question)[0]


def test_invalid_and_unparsed_calls_count_as_attempts_that_did_not_run():
    question = QUESTIONS["lookup"]
    t = trajectory(
        question,
        {"role": "assistant", "content": None, "tool_calls": [call("c1", "lookup_price", item="spaceship")]},
        {"role": "tool", "tool_call_id": "c1", "content": "Error"},
        make_choice([1, 2], content='<tool_call>\n{"name": "lookup_price", "argu'),  # cut off: the server left it text
        {"role": "user", "content": "That call was cut off. Try again."},
        {"role": "assistant", "content": None, "tool_calls": [call("c2", "divide", a=1, b=2)]},
        {"role": "tool", "tool_call_id": "c2", "content": "Error"},
    )
    episode = episode_of(t, question)
    assert (episode.attempted_calls, episode.valid_calls, episode.answer, episode.turns) == (3, 0, None, 3)
    assert shaped_reward(episode, question) == 0.0


def test_tools_never_raise_for_what_a_model_writes():
    prices = QUESTIONS["lookup"].prices
    for name, arguments in [
        ("add", "not json"),
        ("add", "[1, 2]"),
        ("add", '{"a": "x", "b": 2}'),
        ("multiply", '{"a": 1}'),
        ("lookup_price", '{"item": 7}'),
        ("convert_units", '{"value": 1, "from_unit": "inch", "to_unit": "liter"}'),
        ("convert_units", '{"value": "lots", "from_unit": "inch", "to_unit": "centimeter"}'),
        ("nothing", "{}"),
    ]:
        result = execute(name, arguments, prices)
        assert result.value is None and result.content.startswith("Error"), (name, arguments, result)
    assert numbers_in("It costs $1,234.50, not 12.") == [1234.5, 12.0]
