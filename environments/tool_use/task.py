"""Questions whose answer only a tool's result gives, the tools that give it, and the rewards.

Each question draws its numbers at random (3- and 5-digit arithmetic a 135M model cannot do in its head) or
asks for a fact only this question's hidden price list holds, so a right answer means the agent called the
right tool and used what it returned. Kinds: a product, a sum, a price lookup, a unit conversion, and a
two-step cost (look a price up, then multiply it by a quantity).
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import agentrl
from agentrl.data.tool_calls import unparsed_tool_calls

Arguments = dict[str, Any]


def _function(name: str, description: str, properties: dict[str, Any]) -> dict[str, Any]:
    parameters = {"type": "object", "properties": properties, "required": list(properties)}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


UNITS = {  # (from, to): factor
    ("inch", "centimeter"): 2.54,
    ("mile", "kilometer"): 1.609,
    ("pound", "kilogram"): 0.4536,
    ("gallon", "liter"): 3.785,
    ("foot", "meter"): 0.3048,
}
PLURALS = {"inch": "inches", "foot": "feet", "centimeter": "centimeters", "meter": "meters", "mile": "miles"}
PLURALS |= {
    "kilometer": "kilometers",
    "pound": "pounds",
    "kilogram": "kilograms",
    "gallon": "gallons",
    "liter": "liters",
}
ITEMS = ("lamp", "chair", "kettle", "backpack", "umbrella", "blanket", "mirror", "helmet", "toaster", "jacket")
TOOLS: list[dict[str, Any]] = [
    _function("add", "Add two integers.", {"a": {"type": "integer"}, "b": {"type": "integer"}}),
    _function("multiply", "Multiply two integers.", {"a": {"type": "integer"}, "b": {"type": "integer"}}),
    _function("lookup_price", "The price in dollars of an item in the shop.", {"item": {"type": "string"}}),
    _function(
        "convert_units",
        "Convert a quantity from one unit to another.",
        {
            "value": {"type": "number"},
            "from_unit": {"type": "string", "enum": sorted({f for f, _ in UNITS})},
            "to_unit": {"type": "string", "enum": sorted({t for _, t in UNITS})},
        },
    ),
]
KINDS = ("multiply", "add", "lookup", "convert", "cost")
TEMPLATES = {
    "multiply": ("What is {a} times {b}?", "Compute {a} multiplied by {b}.", "What is the product of {a} and {b}?"),
    "add": ("What is {a} plus {b}?", "Add {a} and {b}.", "What is the sum of {a} and {b}?"),
    "lookup": (
        "How much does a {item} cost?",
        "What is the price of a {item}?",
        "What does the shop charge for a {item}?",
    ),
    "convert": ("How many {to} is {value} {from_}?", "Convert {value} {from_} to {to}."),
    "cost": ("How much do {n} {item}s cost?", "What is the price of {n} {item}s together?"),
}


@dataclass(frozen=True)
class Call:
    """One tool call: the tool's name and its arguments."""

    name: str
    arguments: Arguments


@dataclass(frozen=True)
class Question:
    """A question, the calls that answer it (in order) and the answer, which is the last call's result."""

    question_id: str
    kind: str
    question: str
    calls: tuple[Call, ...]
    answer: float
    prices: dict[str, int] = field(default_factory=dict)
    """This question's hidden price list, what `lookup_price` reads."""


def _question(rng: random.Random, kind: str, question_id: str) -> Question:
    template = rng.choice(TEMPLATES[kind])
    prices = {item: rng.randint(5, 250) for item in ITEMS}
    item = rng.choice(ITEMS)
    if kind in ("multiply", "add"):
        a, b = (rng.randint(100, 999), rng.randint(11, 99)) if kind == "multiply" else (
            rng.randint(1000, 99999), rng.randint(1000, 99999)
        )  # fmt: skip
        calls: tuple[Call, ...] = (Call(kind, {"a": a, "b": b}),)
        text = template.format(a=a, b=b)
    elif kind == "lookup":
        calls, text = (Call("lookup_price", {"item": item}),), template.format(item=item)
    elif kind == "convert":
        (from_, to), value = rng.choice(sorted(UNITS)), rng.randint(2, 200)
        calls = (Call("convert_units", {"value": value, "from_unit": from_, "to_unit": to}),)
        text = template.format(value=value, from_=PLURALS[from_], to=PLURALS[to])
    else:
        n = rng.randint(2, 9)
        calls = (Call("lookup_price", {"item": item}), Call("multiply", {"a": n, "b": prices[item]}))
        text = template.format(n=n, item=item)
    answer = float(run_tool(calls[-1].name, calls[-1].arguments, prices))
    return Question(question_id, kind, text, calls, answer, prices)


def questions(split: str, count: int, *, seed: int = 0) -> list[Question]:
    """`count` questions of `split` ("train" or "test": disjoint seeds), the kinds in turn."""
    rng = random.Random(f"tool-use/{split}/{seed}")
    return [_question(rng, KINDS[i % len(KINDS)], f"{split}-{i}") for i in range(count)]


def question_at(split: str, index: int) -> Question:
    """The `index`-th question of `split`, as `questions` gives it (a question's draw does not depend on the count)."""
    return questions(split, index + 1)[index]


def python_tools(question: Question) -> list[Callable[..., str]]:
    """The tools as typed Python functions bound to `question`'s price list, for agent frameworks that build a
    tool's schema from its function (`TOOLS`' descriptions as docstrings; results as `execute` gives them)."""

    def run(name: str, **arguments: object) -> str:
        return execute(name, json.dumps(arguments), question.prices).content

    def add(a: int, b: int) -> str:
        return run("add", a=a, b=b)

    def multiply(a: int, b: int) -> str:
        return run("multiply", a=a, b=b)

    def lookup_price(item: str) -> str:
        return run("lookup_price", item=item)

    def convert_units(value: float, from_unit: str, to_unit: str) -> str:
        return run("convert_units", value=value, from_unit=from_unit, to_unit=to_unit)

    functions: list[Callable[..., str]] = [add, multiply, lookup_price, convert_units]
    descriptions = {t["function"]["name"]: t["function"]["description"] for t in TOOLS}
    for function in functions:
        function.__doc__ = descriptions[function.__name__]
    return functions


def run_tool(name: str, arguments: Arguments, prices: dict[str, int]) -> int | float:
    """A valid call's result; `KeyError` for an item not in the shop or a conversion it cannot do."""
    if name == "add":
        return int(arguments["a"]) + int(arguments["b"])
    if name == "multiply":
        return int(arguments["a"]) * int(arguments["b"])
    if name == "lookup_price":
        return prices[str(arguments["item"]).strip().lower().removesuffix("s")]
    factor = UNITS[(arguments["from_unit"], arguments["to_unit"])]
    return round(float(arguments["value"]) * factor, 2)


@dataclass(frozen=True)
class ToolResult:
    """What one call returned to the model, and whether it ran (known tool, arguments that fit)."""

    content: str
    value: float | None = None


def execute(name: str, arguments: str, prices: dict[str, int]) -> ToolResult:
    """Run a call as the model wrote it; never raises for anything the model wrote, errors go back as text."""
    tool = next((t["function"] for t in TOOLS if t["function"]["name"] == name), None)
    if tool is None:
        return ToolResult(f"Error: no tool named {name!r}; the tools are {[t['function']['name'] for t in TOOLS]}.")
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return ToolResult(f"Error: the arguments of {name} are not JSON.")
    if not isinstance(parsed, dict) or set(parsed) != set(tool["parameters"]["required"]):
        return ToolResult(f"Error: {name} takes exactly {tool['parameters']['required']}.")
    try:
        value = run_tool(name, parsed, prices)
    except KeyError:
        if name == "lookup_price":
            return ToolResult(f"Error: the shop sells no {parsed['item']!r}; it sells {', '.join(ITEMS)}.")
        pairs = ", ".join(f"{f} to {t}" for f, t in sorted(UNITS))
        return ToolResult(f"Error: convert_units converts {pairs}.")
    except (TypeError, ValueError, OverflowError):
        return ToolResult(f"Error: the arguments of {name} must be numbers where its schema says so.")
    return ToolResult(format_number(value), float(value))


def format_number(value: float) -> str:
    """An integer without a decimal point, otherwise up to two decimals."""
    return str(int(value)) if float(value).is_integer() else f"{value:.2f}".rstrip("0")


NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def numbers_in(text: str) -> list[float]:
    """The numbers a reply states ("1,234.5" is one number)."""
    return [float(match.replace(",", "")) for match in NUMBER.findall(text)]


@dataclass
class Episode:
    """What happened in one rollout: the calls made and their results, and the final text answer."""

    attempted_calls: int = 0
    """Calls the model opened: parsed ones and call text the server could not parse."""
    valid_calls: int = 0
    """Calls that ran: a known tool, arguments that fit."""
    results: list[tuple[Call, float]] = field(default_factory=list)
    answer: str | None = None
    turns: int = 0


def episode_of(trajectory: agentrl.Trajectory, question: Question) -> Episode:
    """The episode a trajectory records, read from its messages (the calls are run again: tools are pure): every
    call the model opened, those that ran and what they returned, and its first turn without a call, the answer."""
    episode = Episode()
    for message in trajectory.messages():
        if message["role"] != "assistant":
            continue
        content = message.get("content") if isinstance(message.get("content"), str) else None
        calls = [
            (c["function"]["name"], c["function"]["arguments"])
            for c in message.get("tool_calls") or []
            if c.get("type") == "function"
        ]
        episode.turns += 1
        unparsed = unparsed_tool_calls(content)
        episode.attempted_calls += len(calls) + unparsed
        if not calls and not unparsed:
            episode.answer = content or ""
            break
        for name, arguments in calls:
            result = execute(name, arguments, question.prices)
            if result.value is not None:
                episode.valid_calls += 1
                episode.results.append((Call(name, json.loads(arguments)), result.value))
    return episode


def _same_call(made: Call, expected: Call) -> bool:
    """Whether a call that ran is the one `expected` names (arithmetic in either order, items in the plural)."""
    if made.name != expected.name:
        return False
    if made.name in ("add", "multiply"):
        return sorted(made.arguments.values()) == sorted(expected.arguments.values())
    if made.name == "lookup_price":
        return str(made.arguments["item"]).strip().lower().removesuffix("s") == str(expected.arguments["item"])
    same_units = all(made.arguments[k] == expected.arguments[k] for k in ("from_unit", "to_unit"))
    return same_units and math.isclose(float(made.arguments["value"]), expected.arguments["value"])


def succeeded(episode: Episode, question: Question) -> bool:
    """The strict reward: the final answer states the right number, and this episode's own call of the right
    tool returned it (the result used, not guessed)."""
    if episode.answer is None or not any(math.isclose(n, question.answer) for n in numbers_in(episode.answer)):
        return False
    last = question.calls[-1]
    return any(call.name == last.name and math.isclose(value, question.answer) for call, value in episode.results)


def shaped_reward(episode: Episode, question: Question) -> float:
    """1 for a strict success; otherwise partial credit in [0, 0.6]: 0.4 x the share of the needed calls made
    with the right arguments, 0.1 for answering in text at all, 0.1 x the share of attempted calls that ran."""
    if succeeded(episode, question):
        return 1.0
    made = sum(any(_same_call(c, expected) for c, _ in episode.results) for expected in question.calls)
    valid_share = episode.valid_calls / episode.attempted_calls if episode.attempted_calls else 0.0
    return 0.4 * made / len(question.calls) + 0.1 * (episode.answer is not None) + 0.1 * valid_share
