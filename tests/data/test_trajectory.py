"""Trajectory / TrajectoryGroup: validation with errors that name the field, and JSON round-trips."""

import json
import math

import pytest
from openai.types.chat.chat_completion import Choice
from pydantic import ValidationError

from agentrl import History, Trajectory, TrajectoryGroup
from tests.helpers import make_choice


def test_json_round_trip_keeps_choices_token_ids_and_logprobs():
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
    traj = Trajectory(
        messages_and_choices=[
            {"role": "user", "content": "hi"},
            make_choice([5, 6, 2], [-0.1, -0.2, -0.3], content=None, tool_calls=[call]),
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},
            make_choice([9, 2], [-1.5, -0.25], content="done"),
        ],
        tools=[{"type": "function", "function": {"name": "f"}}],
        reward=0.5,
        metrics={"turns": 2, "won": True},
        metadata={"scenario": "s1", "seed": 3},
        logs=["note"],
        additional_histories=[History(messages_and_choices=[{"role": "user", "content": "b"}, make_choice([1, 2])])],
    )
    restored = Trajectory.model_validate_json(traj.model_dump_json())
    assert restored == traj
    choice = restored.messages_and_choices[1]
    assert isinstance(choice, Choice)
    assert choice.model_extra["token_ids"] == [5, 6, 2]
    assert [e.logprob for e in choice.logprobs.content] == [-0.1, -0.2, -0.3]
    assert isinstance(restored.additional_histories[0].messages_and_choices[1], Choice)
    assert restored.metrics == {"turns": 2.0, "won": 1.0}


def test_messages_turn_choices_into_assistant_dicts():
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    traj = Trajectory(
        messages_and_choices=[{"role": "user", "content": "hi"}, make_choice([1], content=None, tool_calls=[call])]
    )
    assert traj.messages()[1] == {"role": "assistant", "content": None, "tool_calls": [call]}
    assert len(traj.choices()) == 1


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ({"content": "no role"}, "has no 'role'"),
        ({"role": "robot", "content": "x"}, "'role' is 'robot'"),
        ({"role": "user", "content": 42}, "'content' must be a string"),
        ({"role": "user"}, "needs 'content'"),
        ({"role": "tool", "content": "x"}, "tool_call_id"),
        (
            {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f", "arguments": {}}}]},
            "JSON string",
        ),
        ({"role": "user", "content": "x", "tool_calls": []}, "only assistant"),
    ],
)
def test_malformed_messages_raise_a_pydantic_error_naming_the_field(message, expected):
    with pytest.raises(ValidationError) as info:
        Trajectory(messages_and_choices=[{"role": "user", "content": "fine"}, message])
    text = str(info.value)
    assert "messages_and_choices.1" in text and expected in text


def test_a_message_that_is_not_a_dict_is_rejected():
    with pytest.raises(ValidationError, match="messages_and_choices.0"):
        Trajectory(messages_and_choices=["hello"])


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_reward_and_metrics_are_rejected(bad):
    with pytest.raises(ValidationError, match="reward"):
        Trajectory(reward=bad)
    with pytest.raises(ValidationError, match="metrics.score"):
        Trajectory(metrics={"score": bad})


def test_unknown_fields_are_rejected_not_silently_dropped():
    with pytest.raises(ValidationError, match="rewrad"):
        Trajectory(rewrad=1.0)


async def _rollout(reward: float) -> Trajectory:
    return Trajectory(reward=reward)


async def test_group_from_trajectories_and_from_awaitables():
    done = TrajectoryGroup([Trajectory(reward=1.0), Trajectory(reward=0.0)])
    assert done.rewards == [1.0, 0.0] and done.pending == []
    pending = TrajectoryGroup(_rollout(r) for r in (0.1, 0.2))
    assert pending.trajectories == [] and len(pending.pending) == 2
    with pytest.raises(ValueError, match="gather_trajectory_groups"):
        pending.model_dump_json()
    for awaitable in pending.pending:
        await awaitable  # consume, so no "never awaited" warning
    restored = TrajectoryGroup.model_validate_json(done.model_dump_json())
    assert restored.rewards == [1.0, 0.0]
    assert json.loads(done.model_dump_json())["exceptions"] == []


async def test_log_track_duration_and_finish_record_into_the_trajectory():
    import asyncio
    import time

    trajectory = Trajectory(messages_and_choices=[{"role": "user", "content": "hi"}])
    trajectory.log("tool failed, retried")
    with trajectory.track_duration("tool"):
        time.sleep(0.02)
    async with trajectory.track_duration("tool"):  # ART writes `async with`; both add up
        await asyncio.sleep(0.02)
    with pytest.raises(ValueError), trajectory.track_duration("judge"):  # the time counts even when the block raises
        raise ValueError("boom")
    assert trajectory.finish() is trajectory
    assert trajectory.logs == ["tool failed, retried"]
    assert 0.04 <= trajectory.metrics["tool_duration"] < 1.0 and "judge_duration" in trajectory.metrics
    assert trajectory.metrics["duration"] >= trajectory.metrics["tool_duration"]  # ART's metric names
    restored = Trajectory.model_validate_json(trajectory.model_dump_json())  # numbers, so they round-trip
    assert restored.metrics == trajectory.metrics


def test_what_is_appended_is_checked_and_a_litellm_choice_becomes_an_openai_choice_with_the_gateway_fields():
    import litellm

    trajectory = Trajectory(messages_and_choices=[{"role": "user", "content": "hi"}])
    raw = litellm.types.utils.Choices(
        finish_reason="stop",
        index=0,
        message={"role": "assistant", "content": "hello"},
        provider_specific_fields={"completion_id": "chatcmpl-1", "policy_step": 3, "token_ids": [5, 6]},
    )
    trajectory.messages_and_choices.append(raw)
    choice = trajectory.messages_and_choices[-1]
    assert isinstance(choice, Choice) and trajectory.messages()[-1] == {"role": "assistant", "content": "hello"}
    assert choice.model_extra["completion_id"] == "chatcmpl-1" and choice.model_extra["token_ids"] == [5, 6]
    assert trajectory.policy_steps() == [3]
    with pytest.raises(ValueError, match="'role' is 'bot'"):
        trajectory.messages_and_choices.append({"role": "bot", "content": "x"})
    with pytest.raises(ValueError, match="needs 'content'"):
        trajectory.messages_and_choices += [{"role": "user"}]
    trajectory.messages_and_choices[0] = {"role": "user", "content": "hello again"}
    assert trajectory.messages()[0]["content"] == "hello again" and len(trajectory.messages_and_choices) == 2
