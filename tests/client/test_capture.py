"""Automatic trajectory capture: completions made through the gateway by any client become the trajectory.

Fast tier: how calls are stitched into conversations. Real server: a LangGraph agent (LangChain's own
OpenAI client, never told about trajectories) is captured, and its turns train on the exact tokens sampled.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

import agentrl
from agentrl.client.capture import capture_trajectory, current_trajectory, record_completion
from tests.helpers import assert_trains_on_exact_tokens


def answer(text: str, completion_id: str, tool_calls: list[dict] | None = None) -> dict:
    """A chat completion as the gateway returns it (its choices carry `completion_id`)."""
    message = {"role": "assistant", "content": text, **({"tool_calls": tool_calls} if tool_calls else {})}
    return {"id": completion_id, "choices": [{"index": 0, "message": message, "finish_reason": "stop",
                                              "completion_id": completion_id}]}  # fmt: skip


def test_calls_that_continue_a_conversation_extend_it_and_others_start_a_new_history():
    trajectory = agentrl.Trajectory()
    user = {"role": "user", "content": "What is 2+2?"}
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 2}'}}
    record_completion(trajectory, {"messages": [user], "tools": [{"type": "function"}]}, answer("", "a", [call]))
    # The framework sends the turn back with its arguments re-serialised and an empty content as None.
    echoed = {"role": "assistant", "content": None, "tool_calls": [
        {**call, "function": {"name": "add", "arguments": '{"b": 2, "a": 2}'}}]}  # fmt: skip
    tool = {"role": "tool", "tool_call_id": "c1", "content": "4"}
    record_completion(trajectory, {"messages": [user, echoed, tool], "tools": [{"type": "function"}]}, answer("4", "b"))
    record_completion(trajectory, {"messages": [{"role": "user", "content": "Summarise."}]}, answer("ok", "c"))

    assert [m["role"] if isinstance(m, dict) else "choice" for m in trajectory.messages_and_choices] == [
        "user", "choice", "tool", "choice"]  # fmt: skip
    assert trajectory.tools == [{"type": "function"}]
    assert [c.model_extra["completion_id"] for c in trajectory.choices()] == ["a", "b"]
    (summary,) = trajectory.additional_histories  # not a continuation (other messages, no tools)
    assert summary.choices()[0].message.content == "ok" and summary.tools is None


async def test_concurrent_captures_each_get_their_own_trajectory():
    async def rollout(name: str) -> agentrl.Trajectory:
        with capture_trajectory() as trajectory:
            await asyncio.sleep(0.01)
            captured = current_trajectory()
            assert captured is trajectory
            record_completion(captured, {"messages": [{"role": "user", "content": name}]}, answer(name, name))
        return trajectory

    first, second = await asyncio.gather(rollout("x"), rollout("y"))
    assert first.messages_and_choices[0]["content"] == "x" and second.messages_and_choices[0]["content"] == "y"
    assert current_trajectory() is None


@pytest.mark.slow
async def test_a_langgraph_agent_is_captured_and_trains_on_the_exact_sampled_tokens(served_model):
    langchain_openai = pytest.importorskip("langchain_openai")
    graph_module = pytest.importorskip("langgraph.graph")
    from langchain_core.messages import HumanMessage

    endpoint = served_model.backend.endpoint(served_model)  # the gateway's URL and key
    llm = langchain_openai.ChatOpenAI(
        model=served_model.inference_name,
        base_url=endpoint.base_url,
        api_key=endpoint.api_key,
        max_tokens=12,
        temperature=1.0,
    )

    async def draft(state: dict) -> dict:
        return {"messages": [await llm.ainvoke(state["messages"])]}

    async def shorten(state: dict) -> dict:
        follow_up = HumanMessage("Now say it in three words.")
        return {"messages": [follow_up, await llm.ainvoke([*state["messages"], follow_up])]}

    builder = graph_module.StateGraph(graph_module.MessagesState)
    builder.add_node("draft", draft)
    builder.add_node("shorten", shorten)
    builder.add_edge(graph_module.START, "draft")
    builder.add_edge("draft", "shorten")
    builder.add_edge("shorten", graph_module.END)
    agent = builder.compile()

    async def rollout(reward: float) -> agentrl.Trajectory:
        with capture_trajectory() as trajectory:
            await agent.ainvoke({"messages": [HumanMessage("Name a colour.")]})
        trajectory.reward = reward
        return trajectory

    trajectories = await asyncio.gather(rollout(0.0), rollout(1.0))
    for trajectory in trajectories:  # one conversation: user, answer, follow-up, answer
        assert [m["role"] if isinstance(m, dict) else "choice" for m in trajectory.messages_and_choices] == [
            "user", "choice", "user", "choice"]  # fmt: skip
        assert not trajectory.additional_histories

    await assert_trains_on_exact_tokens(served_model, list(trajectories))


@pytest.mark.slow
async def test_litellm_choices_appended_as_they_come_train_on_the_exact_sampled_tokens(served_model):
    """A user's rollout: `litellm.acompletion(**model.litellm_params())`, `response.choices[0]` appended
    as is (a litellm `Choices`, not an openai `Choice`), two turns."""
    import litellm
    from openai.types.chat.chat_completion import Choice

    async def rollout(reward: float) -> agentrl.Trajectory:
        trajectory = agentrl.Trajectory(messages_and_choices=[{"role": "user", "content": "Name a colour."}])
        for follow_up in ("Now name another.", None):
            response = await litellm.acompletion(
                **served_model.litellm_params(), messages=trajectory.messages(), max_tokens=8, temperature=1.0
            )
            assert type(response.choices[0]).__name__ == "Choices"
            trajectory.messages_and_choices.append(response.choices[0])
            assert trajectory.messages()[-1]["role"] == "assistant" and "content" in trajectory.messages()[-1]
            if follow_up:
                trajectory.messages_and_choices.append({"role": "user", "content": follow_up})
        trajectory.reward = reward
        return trajectory

    step = await served_model.get_step()
    trajectories = await asyncio.gather(rollout(0.0), rollout(1.0))
    for trajectory in trajectories:
        assert len(trajectory.choices()) == 2 and all(isinstance(c, Choice) for c in trajectory.choices())
        assert trajectory.policy_steps() == [step, step], "each turn says which adapter sampled it"
        assert trajectory.initial_policy_version == trajectory.final_policy_version == step
    await assert_trains_on_exact_tokens(served_model, list(trajectories))


@pytest.mark.slow
async def test_a_streamed_answer_is_captured_and_trains_on_the_exact_sampled_tokens(served_model):
    """The openai client streaming (async, and sync on a worker thread): the chunks the client reads are
    joined into the turn, and the gateway's stamps let the trainer find the exact tokens."""
    import openai

    endpoint = served_model.backend.endpoint(served_model)

    async def streamed_async() -> str:
        client = openai.AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key)
        stream = await client.chat.completions.create(
            model=served_model.inference_name, messages=[{"role": "user", "content": "Count to five."}],
            max_tokens=12, temperature=1.0, stream=True,
        )  # fmt: skip
        return "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])

    def streamed_sync() -> str:
        client = openai.OpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key)
        stream = client.chat.completions.create(
            model=served_model.inference_name, messages=[{"role": "user", "content": "Count to five."}],
            max_tokens=12, temperature=1.0, stream=True,
        )  # fmt: skip
        return "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)

    async def rollout(reward: float, read: Any) -> agentrl.Trajectory:
        with capture_trajectory() as trajectory:
            text = await read()
        assert len(trajectory.choices()) == 1 and trajectory.messages()[-1]["content"] == text
        assert trajectory.policy_steps() == [await served_model.get_step()]
        trajectory.reward = reward
        return trajectory

    trajectories = [
        await rollout(0.0, streamed_async),
        await rollout(1.0, lambda: asyncio.to_thread(streamed_sync)),
    ]
    await assert_trains_on_exact_tokens(served_model, list(trajectories))


def test_a_stream_split_anywhere_is_joined_into_one_answer_with_its_tool_calls():
    from agentrl.gateway.chunks import StreamedAnswer

    chunks = [
        {"model": "m@2", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Let me "}, "completion_id": "c1", "policy_step": 2}]},
        {"model": "m@2", "choices": [{"index": 0, "delta": {"content": "look."}, "completion_id": "c1", "policy_step": 2}]},
        {"model": "m@2", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_1", "function": {"name": "search", "arguments": '{"q": '}}]}}]},
        {"model": "m@2", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '"x"}'}}]}, "finish_reason": "tool_calls"}]},
    ]  # fmt: skip
    data = b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"
    streamed = StreamedAnswer()
    done = [streamed.feed(data[i : i + 7]) for i in range(0, len(data), 7)]  # cut mid-line, mid-JSON
    assert done[-1] and not done[0]
    (choice,) = streamed.answer()["choices"]
    assert choice["message"]["content"] == "Let me look." and choice["finish_reason"] == "tool_calls"
    assert choice["message"]["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "search", "arguments": '{"q": "x"}'}}
    ]
    assert choice["completion_id"] == "c1" and choice["policy_step"] == 2


@pytest.mark.slow
async def test_an_agent_program_that_knows_only_a_session_url_is_captured_and_trains(served_model):
    import os
    import sys

    import httpx

    async def rollout(reward: float) -> agentrl.Trajectory:
        async with served_model.session() as session:
            agent = await asyncio.create_subprocess_exec(
                sys.executable, "tests/session_agent.py", session.model,
                env={**os.environ, "OPENAI_BASE_URL": session.base_url, "OPENAI_API_KEY": session.api_key},
                stdout=asyncio.subprocess.PIPE,
            )  # fmt: skip
            printed, _ = await agent.communicate()
            assert agent.returncode == 0
        trajectory = session.trajectory
        # user, answer, user, streamed answer: one conversation, as the program held it
        assert [m["role"] for m in trajectory.messages()] == ["user", "assistant", "user", "assistant"]
        assert trajectory.messages()[-1]["content"] == printed.decode().rstrip("\n")
        assert trajectory.policy_steps() == [await served_model.get_step()] * 2
        async with httpx.AsyncClient() as http:  # the session is closed: refused, and nothing is kept
            refused = await http.post(
                f"{session.base_url}/chat/completions",
                json={"model": session.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
                headers={"Authorization": f"Bearer {session.api_key}"},
            )
        assert refused.status_code == 404 and "closed or unknown" in refused.json()["error"]["message"]
        trajectory.reward = reward
        return trajectory

    trajectories = await asyncio.gather(rollout(0.0), rollout(1.0))
    await assert_trains_on_exact_tokens(served_model, list(trajectories))
