"""2048 for an LLM agent: scenarios, the multi-turn rollout, the reward, evaluation, presets.

Move format: the model answers `<move>left</move>`. The packaged 135M model almost never emits a
valid tool call unprompted (0 of 16 in a probe here), and with a strict tag parse it made no valid
first move in 24 held-out games, so every group scored alike and RL had no signal. So a reply
without tags counts as the first direction word it names; `tagged_move_rate` tracks the format.

Context: every turn shows only the current board. The board is the whole state of the game, so
earlier turns add tokens but no information, and the prompt stays the same size however long the
game runs. Each turn is its own conversation (`additional_histories`), all trained with the game's
advantage.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import agentrl

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam

from .game import Game

SYSTEM_PROMPT = (
    "You are playing 2048. Tiles slide in the direction you choose and equal tiles merge. "
    "Reach the target tile. Answer with one move inside tags: <move>left</move>, <move>right</move>, "
    "<move>up</move> or <move>down</move>."
)
_TAGGED = re.compile(r"<move>\s*(left|right|up|down)\s*</move>", re.IGNORECASE)
_WORD = re.compile(r"\b(left|right|up|down)\b", re.IGNORECASE)
INVALID_MOVE_FACTOR = 0.5  # an unparseable or impossible move ends the game and halves its reward


@dataclass(frozen=True)
class Scenario:
    """One game: its seed and rules."""

    seed: int
    size: int
    target: int
    max_moves: int


@dataclass(frozen=True)
class Preset:
    """A training set-up sized for a machine."""

    size: int
    target: int
    max_moves: int
    base_model: str
    steps: int
    groups_per_step: int
    group_size: int
    learning_rate: float
    max_tokens: int


PRESETS = {
    # Shows learning on a 2-core CPU with the packaged model: a 3x3 board, a low target, short games.
    # Sized for < 30 min: a step's cost grows with the moves the agent survives (each move is a turn).
    "cpu": Preset(
        size=3,
        target=64,
        max_moves=6,
        base_model="smollm2-135m-instruct",
        steps=12,
        groups_per_step=4,
        group_size=6,
        learning_rate=5e-4,
        max_tokens=12,
    ),
    # The real game for a GPU and a model that can plan.
    "gpu": Preset(
        size=4,
        target=2048,
        max_moves=600,
        base_model="Qwen/Qwen2.5-3B-Instruct",
        steps=200,
        groups_per_step=16,
        group_size=16,
        learning_rate=1e-5,
        max_tokens=64,
    ),
}


def scenarios(split: str, count: int, preset: Preset) -> list[Scenario]:
    """Seeded games; train and test seeds never overlap."""
    offset = {"train": 0, "test": 1_000_000}[split]
    return [Scenario(offset + i, preset.size, preset.target, preset.max_moves) for i in range(count)]


def parse_move(text: str) -> tuple[str | None, bool]:
    """The move in a reply and whether it was tagged; (None, False) when there is none."""
    tagged = _TAGGED.search(text)
    if tagged:
        return tagged.group(1).lower(), True
    word = _WORD.search(text)
    return (word.group(1).lower(), False) if word else (None, False)


def reward(game: Game, ended_by_invalid_move: bool) -> float:
    """1 for a win; otherwise log-scaled progress of the max tile and the board sum, in [0, 0.9].

    The log2 makes each doubling worth the same; a win is kept clearly above any non-winning game.
    """
    if game.won:
        return 1.0
    board_sum = sum(sum(row) for row in game.board)
    max_part = math.log2(game.max_tile) / math.log2(game.target)
    sum_part = min(1.0, math.log2(board_sum) / math.log2(game.target * 2))
    shaped = 0.9 * (0.7 * max_part + 0.3 * sum_part)
    return shaped * (INVALID_MOVE_FACTOR if ended_by_invalid_move else 1.0)


@agentrl.traced
async def rollout(model: agentrl.Model, scenario: Scenario, *, max_tokens: int = 12) -> agentrl.Trajectory:
    """Play one game, a chat completion per move, until it is won, lost, cut off, or a move is invalid."""
    client = model.openai_client()
    game = Game(size=scenario.size, target=scenario.target, seed=scenario.seed)
    turns: list[agentrl.History] = []
    invalid = False
    tagged_moves = 0
    while not game.over and game.moves < scenario.max_moves:
        messages: list[ChatCompletionMessageParam] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"Target tile: {game.target}\nBoard:\n{game.render()}\nYour move?"},
        ]
        completion = await client.chat.completions.create(
            model=model.inference_name, messages=messages, max_tokens=max_tokens, temperature=1.0
        )
        choice = completion.choices[0]
        turns.append(agentrl.History(messages_and_choices=[*messages, choice]))
        direction, tagged = parse_move(choice.message.content or "")
        tagged_moves += tagged
        if direction is None or not game.play(direction):
            invalid = True
            break
    trajectory = agentrl.Trajectory(
        messages_and_choices=turns[-1].messages_and_choices if turns else [],
        additional_histories=turns[:-1],
        reward=reward(game, invalid),
        metadata={"seed": scenario.seed},
    )
    trajectory.metrics.update(
        max_tile=game.max_tile,
        moves=game.moves,
        won=game.won,
        invalid_move=invalid,
        tagged_move_rate=tagged_moves / max(len(turns), 1),
    )
    return trajectory


async def evaluate(model: agentrl.Model, test: list[Scenario], *, max_tokens: int = 12) -> list[agentrl.Trajectory]:
    """One game per held-out scenario."""
    return await agentrl.gather_trajectories(
        (rollout(model, s, max_tokens=max_tokens) for s in test), desc=f"eval {model.inference_name}"
    )
