"""The shipped instruction tasks, written from templates: `python -m agentrl_environments.rubric.generate`
rewrites data/train.jsonl and data/test.jsonl (seeded, so the same files come back)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from agentrl.foundation.files import write_text_atomic

from .tasks import DATA, InstructionTask

NAMES = ["Maria", "Tom", "Aisha", "Kenji", "Lucas", "Priya", "Sofia", "Omar", "Hannah", "Diego", "Mei", "Noah"]
GIFTS = ["flowers", "book", "cookies", "scarf", "plant", "tea", "card", "mug"]
TOPICS = ["sleeping better", "saving money", "learning a language", "staying focused", "cooking at home",
          "keeping a garden", "running", "reading more", "drinking more water", "packing for a trip",
          "writing emails", "cleaning a kitchen", "meeting new people", "studying for a test"]  # fmt: skip
EVENTS = ["team lunch", "project review", "fire drill", "budget meeting", "training session", "office party"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]
TIMES = ["9 AM", "10 AM", "11 AM", "1 PM", "2 PM", "3 PM", "4 PM"]
PLACES = ["room 4", "the kitchen", "the main hall", "the library", "the lobby"]
ITEMS = ["lamp", "backpack", "headphones", "kettle", "jacket", "chair", "blender"]
DATES = ["May 3", "June 12", "July 1", "August 20", "September 9", "October 15"]
SIGNS = ["Anna", "Ben", "Carla", "Dev", "Eva"]
COUNTRIES = {"France": "Paris", "Japan": "Tokyo", "Italy": "Rome", "Egypt": "Cairo", "Canada": "Ottawa",
             "Spain": "Madrid", "Kenya": "Nairobi", "Peru": "Lima", "Germany": "Berlin", "Norway": "Oslo",
             "Greece": "Athens", "Portugal": "Lisbon", "Mexico": "Mexico City", "Chile": "Santiago",
             "Thailand": "Bangkok", "Ireland": "Dublin"}  # fmt: skip


def _thank_you(rng: random.Random) -> dict[str, Any]:
    name, gift, limit = rng.choice(NAMES), rng.choice(GIFTS), rng.choice([30, 40, 50])
    return {
        "prompt": f"Write a short thank-you note to {name} for the {gift}. Keep it under {limit} words.",
        "rubrics": [
            f"The note addresses {name} by name.",
            f"The note thanks {name} for the {gift}.",
            f"The note is under {limit} words.",
        ],
        "eval_rubrics": [
            f"Does the note use the name {name}?",
            f"Is the {gift} mentioned as the thing being thanked for?",
            f"Is the note shorter than {limit} words?",
        ],
        "checks": [
            {"kind": "contains", "values": [name]},
            {"kind": "contains", "values": [gift]},
            {"kind": "max_words", "count": limit - 1},
        ],
    }


def _tips(rng: random.Random) -> dict[str, Any]:
    topic, count = rng.choice(TOPICS), rng.choice([2, 3, 4, 5])
    return {
        "prompt": f"Give exactly {count} tips for {topic}, as a list with one tip per line, each line starting with '- '.",
        "rubrics": [
            f"The response has exactly {count} bullet points.",
            f"Every tip is about {topic}.",
            "Each tip is one short line.",
        ],
        "eval_rubrics": [
            f"Count the list items: are there {count}, no more and no fewer?",
            f"Are all the tips relevant to {topic}?",
            "Is every list item brief, a single line?",
        ],
        "checks": [{"kind": "bullets", "count": count}, None, None],
    }


def _reminder(rng: random.Random) -> dict[str, Any]:
    event, day, time, place = rng.choice(EVENTS), rng.choice(DAYS), rng.choice(TIMES), rng.choice(PLACES)
    return {
        "prompt": f"Write a two-sentence reminder to the team: the {event} is on {day} at {time} in {place}.",
        "rubrics": [
            f"The reminder says the day, {day}.",
            f"The reminder says the time, {time}.",
            f"The reminder says the place, {place}.",
            "The reminder is exactly two sentences long.",
        ],
        "eval_rubrics": [
            f"Is {day} given as the day?",
            f"Is {time} given as the time?",
            f"Does it tell people to go to {place}?",
            "Does it consist of two sentences, no more, no fewer?",
        ],
        "checks": [
            {"kind": "contains", "values": [day]},
            {"kind": "contains", "values": [time, time.replace(" ", "")]},
            {"kind": "contains", "values": [place.removeprefix("the ")]},
            {"kind": "sentences", "count": 2},
        ],
    }


def _refund(rng: random.Random) -> dict[str, Any]:
    item, date, sign = rng.choice(ITEMS), rng.choice(DATES), rng.choice(SIGNS)
    return {
        "prompt": (
            f"A customer asks whether they can return the {item} they bought. Reply politely in under 60 words: "
            f"they can get a refund until {date}. Sign the reply '{sign}'."
        ),
        "rubrics": [
            f"The reply mentions the refund deadline, {date}.",
            f"The reply is about the {item}.",
            f"The reply is signed '{sign}'.",
            "The reply is under 60 words.",
        ],
        "eval_rubrics": [
            f"Does the customer learn that the last day for a refund is {date}?",
            f"Is the {item} named in the reply?",
            f"Does the reply end with the name {sign}?",
            "Is the reply shorter than 60 words?",
        ],
        "checks": [
            {"kind": "contains", "values": [date]},
            {"kind": "contains", "values": [item]},
            {"kind": "contains", "values": [sign]},
            {"kind": "max_words", "count": 59},
        ],
    }


def _capital(rng: random.Random) -> dict[str, Any]:
    country = rng.choice(sorted(COUNTRIES))
    capital = COUNTRIES[country]
    return {
        "prompt": f"In one sentence, tell me the capital of {country}.",
        "rubrics": [f"The response says the capital is {capital}.", "The response is a single sentence."],
        "eval_rubrics": [f"Is {capital} named as the capital?", "Is the answer exactly one sentence?"],
        "checks": [{"kind": "contains", "values": [capital]}, {"kind": "sentences", "count": 1}],
    }


TEMPLATES = (_thank_you, _tips, _reminder, _refund, _capital)


def generate(count: int = 300, *, seed: int = 0) -> list[InstructionTask]:
    """`count` distinct tasks from templates drawn at random (a drawn duplicate is skipped), from one seed."""
    rng = random.Random(seed)
    tasks: dict[str, InstructionTask] = {}
    for _ in range(count * 20):
        template = rng.choice(TEMPLATES)
        fields = template(rng)
        if fields["prompt"] not in tasks:
            tasks[fields["prompt"]] = InstructionTask(
                task_id=f"{template.__name__.strip('_')}-{len(tasks):03d}", **fields
            )
        if len(tasks) == count:
            return list(tasks.values())
    raise ValueError(f"the templates give fewer than {count} distinct tasks")


def write(tasks: list[InstructionTask], path: Path) -> None:
    lines = (json.dumps(t.model_dump(mode="json", exclude_defaults=True)) for t in tasks)
    write_text_atomic(path, "\n".join(lines) + "\n")


def main() -> None:
    tasks = generate()
    random.Random(1).shuffle(tasks)
    cut = len(tasks) * 4 // 5
    write(tasks[:cut], DATA / "train.jsonl")
    write(tasks[cut:], DATA / "test.jsonl")
    print(f"wrote {cut} train and {len(tasks) - cut} test tasks to {DATA}")


if __name__ == "__main__":
    main()
