"""The 2048 engine: merges (each tile once per move), spawn distribution, game over, seeding."""

import random

import pytest

from agentrl_environments.twenty_forty_eight.game import Game, can_move, move, slide_row_left, spawn


@pytest.mark.parametrize(
    ("row", "expected", "points"),
    [
        ((2, 2, 2, 2), (4, 4, 0, 0), 8),
        ((4, 4, 8, 0), (8, 8, 0, 0), 8),  # the new 8 does not merge with the old 8
        ((2, 0, 2, 4), (4, 4, 0, 0), 4),
        ((2, 4, 8, 16), (2, 4, 8, 16), 0),  # no-op
        ((0, 0, 0, 2), (2, 0, 0, 0), 0),
        ((8, 8, 8, 0), (16, 8, 0, 0), 16),  # the leading pair merges first
    ],
)
def test_slide_row_left(row, expected, points):
    assert slide_row_left(row) == (expected, points)


def test_moves_in_every_direction():
    board = ((2, 0, 0, 2), (0, 0, 0, 0), (2, 0, 0, 0), (2, 0, 0, 4))
    assert move(board, "left")[0] == ((4, 0, 0, 0), (0, 0, 0, 0), (2, 0, 0, 0), (2, 4, 0, 0))
    assert move(board, "right")[0] == ((0, 0, 0, 4), (0, 0, 0, 0), (0, 0, 0, 2), (0, 0, 2, 4))
    assert move(board, "up")[0] == ((4, 0, 0, 2), (2, 0, 0, 4), (0, 0, 0, 0), (0, 0, 0, 0))
    assert move(board, "down")[0] == ((0, 0, 0, 0), (0, 0, 0, 0), (2, 0, 0, 2), (4, 0, 0, 4))
    with pytest.raises(ValueError, match="direction"):
        move(board, "diagonal")


def test_a_no_op_move_is_refused_and_spawns_nothing():
    game = Game(size=2, target=64, board=((2, 4), (0, 0)))
    assert game.play("up") is False and game.board == ((2, 4), (0, 0)) and game.moves == 0
    assert game.play("down") is True and game.moves == 1


def test_spawn_distribution_is_about_nine_twos_to_one_four():
    rng = random.Random(0)
    empty = ((0, 0), (0, 0))
    tiles = [max(max(r) for r in spawn(empty, rng)) for _ in range(5000)]
    assert tiles.count(4) / len(tiles) == pytest.approx(0.1, abs=0.015)
    assert set(tiles) == {2, 4}


def test_game_over_and_win_detection():
    stuck = ((2, 4), (4, 2))
    assert not can_move(stuck) and Game(size=2, target=64, board=stuck).over
    assert can_move(((2, 2), (4, 8)))
    assert Game(size=2, target=8, board=((8, 0), (0, 0))).won


def test_same_seed_same_game():
    a, b = Game(size=3, target=64, seed=5), Game(size=3, target=64, seed=5)
    for direction in ["left", "up", "right", "down"] * 3:
        a.play(direction), b.play(direction)
    assert a.board == b.board and a.score == b.score


def test_bad_settings_are_clear_errors():
    with pytest.raises(ValueError, match="power of two"):
        Game(target=100)
    with pytest.raises(ValueError, match="2x2"):
        Game(size=1)


def test_moves_are_read_from_tags_first_then_the_first_direction_word():
    from agentrl_environments.twenty_forty_eight.env import parse_move

    assert parse_move("I think <move> Up </move> is best") == ("up", True)
    assert parse_move("Let's go left, then down.") == ("left", False)
    assert parse_move("upwards is not a move; the leftmost tile") == (None, False)
    assert parse_move("") == (None, False)


def test_reward_prefers_wins_then_bigger_tiles_and_halves_on_invalid_moves():
    from agentrl_environments.twenty_forty_eight.env import reward

    small = Game(size=3, target=64, board=((2, 2, 0), (0, 0, 0), (0, 0, 0)))
    bigger = Game(size=3, target=64, board=((16, 2, 0), (0, 0, 0), (0, 0, 0)))
    won = Game(size=3, target=64, board=((64, 0, 0), (0, 0, 0), (0, 0, 0)))
    assert reward(won, False) == 1.0 > reward(bigger, False) > reward(small, False) > 0
    assert reward(bigger, True) == reward(bigger, False) / 2
    assert reward(bigger, False) <= 0.9
