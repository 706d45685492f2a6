"""The 2048 game engine: pure and seeded. Boards are tuples of rows; 0 is an empty cell.

A move slides every tile as far as it goes in one direction; two equal tiles that meet merge into
their sum, and a tile made by a merge does not merge again in the same move. After a move that
changed the board, a 2 (probability 0.9) or a 4 appears in a random empty cell.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

Board = tuple[tuple[int, ...], ...]
DIRECTIONS = ("left", "right", "up", "down")


def slide_row_left(row: tuple[int, ...]) -> tuple[tuple[int, ...], int]:
    """Slide and merge one row to the left; returns the new row and the points its merges made."""
    tiles = [t for t in row if t]
    merged: list[int] = []
    points = 0
    i = 0
    while i < len(tiles):
        if i + 1 < len(tiles) and tiles[i] == tiles[i + 1]:
            merged.append(tiles[i] * 2)  # the merged tile is final for this move
            points += tiles[i] * 2
            i += 2
        else:
            merged.append(tiles[i])
            i += 1
    return tuple(merged + [0] * (len(row) - len(merged))), points


def _transpose(board: Board) -> Board:
    return tuple(zip(*board))


def move(board: Board, direction: str) -> tuple[Board, int]:
    """The board after sliding in `direction`, and the points scored. No spawn."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    rows = _transpose(board) if direction in ("up", "down") else board
    reverse = direction in ("right", "down")
    new_rows, points = [], 0
    for row in rows:
        slid, gained = slide_row_left(row[::-1] if reverse else row)
        new_rows.append(slid[::-1] if reverse else slid)
        points += gained
    result = tuple(new_rows)
    return (_transpose(result) if direction in ("up", "down") else result), points


def empty_cells(board: Board) -> list[tuple[int, int]]:
    return [(r, c) for r, row in enumerate(board) for c, tile in enumerate(row) if tile == 0]


def spawn(board: Board, rng: random.Random) -> Board:
    """Put a 2 (p=0.9) or a 4 in a random empty cell."""
    cells = empty_cells(board)
    if not cells:
        return board
    r, c = rng.choice(cells)
    tile = 2 if rng.random() < 0.9 else 4
    return tuple(tuple(tile if (i, j) == (r, c) else t for j, t in enumerate(row)) for i, row in enumerate(board))


def can_move(board: Board) -> bool:
    return any(move(board, d)[0] != board for d in DIRECTIONS)


@dataclass
class Game:
    """One game: board, score, moves, and the seeded RNG that spawns tiles."""

    size: int = 4
    target: int = 2048
    seed: int = 0
    board: Board = ()
    score: int = 0
    moves: int = 0
    rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.size < 2:
            raise ValueError("the board needs at least 2x2 cells")
        if self.target < 4 or self.target & (self.target - 1):
            raise ValueError(f"target must be a power of two >= 4, got {self.target}")
        self.rng = random.Random(self.seed)
        if not self.board:
            empty = tuple((0,) * self.size for _ in range(self.size))
            self.board = spawn(spawn(empty, self.rng), self.rng)

    @property
    def max_tile(self) -> int:
        return max(max(row) for row in self.board)

    @property
    def won(self) -> bool:
        return self.max_tile >= self.target

    @property
    def over(self) -> bool:
        return self.won or not can_move(self.board)

    def play(self, direction: str) -> bool:
        """Apply a move; False (and no change) if it would not change the board."""
        new_board, points = move(self.board, direction)
        if new_board == self.board:
            return False
        self.board = spawn(new_board, self.rng)
        self.score += points
        self.moves += 1
        return True

    def render(self) -> str:
        width = len(str(self.max_tile))
        return "\n".join(" ".join(str(t).rjust(width) if t else "_".rjust(width) for t in row) for row in self.board)
