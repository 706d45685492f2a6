"""The gateway: any client's completions are trainable on exactly the tokens the server sampled.

The same two-turn, tool-offering rollout is written four ways (the model's own client, a plain
openai client at the gateway, litellm, raw HTTP) against the real vLLM server behind the real
gateway; the trainer's tokens are compared with what the server sampled, and all four train.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import openai
import pytest

import agentrl
from agentrl.backend.processes import free_port
from agentrl.backend.sampled_tokens import fill_sampled_tokens
from agentrl.gateway.serve import Gateway
from agentrl.gateway.store import SampledChoice, SampledStore
from agentrl.gateway.upstream import Replica
from agentrl.rl.tokenize import sampled_tokens

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]
Complete = Callable[[list[dict[str, Any]]], Awaitable[Any]]


async def two_turns(complete: Complete, reward: float) -> agentrl.Trajectory:
    """Ask, answer any tool call (or nudge), ask again: two sampled assistant turns."""
    trajectory = agentrl.Trajectory(
        messages_and_choices=[
            {"role": "system", "content": "You can call the add tool."},
            {"role": "user", "content": "What is 2 + 3?"},
        ],
        tools=TOOLS,
    )
    for _ in range(2):
        choice = await complete(trajectory.messages())
        # Assigning (not appending) validates: a response's choice as a plain dict becomes a Choice.
        trajectory.messages_and_choices = [*trajectory.messages_and_choices, choice]
        calls = trajectory.choices()[-1].message.tool_calls or []
        for call in calls:
            trajectory.messages_and_choices.append({"role": "tool", "tool_call_id": call.id, "content": "5"})
        if not calls:
            trajectory.messages_and_choices.append({"role": "user", "content": "Answer with the number only."})
    trajectory.reward = reward
    return trajectory


def clients(model: agentrl.TrainableModel) -> dict[str, Complete]:
    gateway = model.backend.gateway
    name = model.inference_name
    params: dict[str, Any] = {"tools": TOOLS, "max_tokens": 24, "temperature": 1.0}

    async def own_client(messages):
        completion = await model.openai_client().chat.completions.create(model=name, messages=messages, **params)
        return completion.choices[0]

    async def plain_openai(messages):
        client = openai.AsyncOpenAI(base_url=gateway.base_url, api_key=gateway.token)
        completion = await client.chat.completions.create(model=name, messages=messages, **params)
        await client.close()
        return completion.choices[0]

    async def with_litellm(messages):
        from agentrl.foundation.litellm_loader import load_litellm  # with its bundled price list: no network at import

        response = await load_litellm().acompletion(
            model=f"openai/{name}", api_base=gateway.base_url, api_key=gateway.token, messages=messages, **params
        )
        choice = response.choices[0].model_dump(exclude_none=True)
        choice.setdefault("completion_id", response.id)  # what a client that drops extra fields keeps
        return choice

    async def raw_http(messages):
        async with httpx.AsyncClient(timeout=120, headers={"Authorization": f"Bearer {gateway.token}"}) as client:
            response = await client.post(
                f"{gateway.base_url}/chat/completions", json={"model": name, "messages": messages, **params}
            )
        response.raise_for_status()
        return response.json()["choices"][0]

    return {"own client": own_client, "openai at gateway": plain_openai, "litellm": with_litellm, "raw http": raw_http}


async def test_four_clients_train_on_exactly_the_sampled_tokens(served_model):
    gateway = served_model.backend.gateway
    completers = clients(served_model)
    rollouts = [two_turns(complete, reward=float(i)) for complete in completers.values() for i in range(2)]
    done = iter(await asyncio.gather(*rollouts))  # all eight at once, as rollouts run
    trajectories = {label: [next(done), next(done)] for label in completers}
    for label, group in trajectories.items():
        (filled,) = fill_sampled_tokens([agentrl.TrajectoryGroup(group)], gateway.store)
        for trajectory in filled.trajectories:
            assert len(trajectory.choices()) == 2, label
            for choice in trajectory.choices():
                completion_id = (choice.model_extra or {})["completion_id"]
                kept = gateway.store.get(completion_id)[choice.index]
                assert sampled_tokens(choice).token_ids == kept.token_ids, label  # exact, not re-tokenized
                assert sampled_tokens(choice).logprobs == kept.logprobs, label
                assert sampled_tokens(choice).prompt_token_ids == kept.prompt_token_ids, label  # the engine's context
    step = await served_model.get_step()
    groups = [agentrl.TrajectoryGroup(group) for group in trajectories.values()]
    result = await served_model.train(groups, agentrl.TrainConfig(learning_rate=1e-4))
    assert result.step == step + 1 and not result.skipped
    # A second turn whose prompt re-renders the first differently is a branch of its conversation: 8 to 16 sequences.
    assert 8 <= result.metrics["num_sequences"] <= 16 and result.metrics["trained_tokens"] > 0
    assert result.metrics["context_exact_turns"] == result.metrics["sampled_turns"] == 16


async def test_a_streamed_completion_is_kept_and_trains_by_its_id(served_model):
    gateway = served_model.backend.gateway
    client = openai.AsyncOpenAI(base_url=gateway.base_url, api_key=gateway.token)
    stream = await client.chat.completions.create(
        model=served_model.inference_name,
        messages=[{"role": "user", "content": "Count to five."}],
        max_tokens=16,
        temperature=1.0,
        stream=True,
    )
    text, streamed_ids, completion_id, finish_reason = "", [], None, None
    async for chunk in stream:
        completion_id = chunk.id
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish_reason = choice.finish_reason or finish_reason
            streamed_ids += (choice.model_extra or {}).get("token_ids") or []
    await client.close()
    (kept,) = gateway.store.get(completion_id)
    assert kept.token_ids == streamed_ids and len(kept.logprobs) == len(streamed_ids) > 0
    assert kept.prompt_token_ids
    # A streaming client builds its own Choice: the text it read, and the completion's id.
    choice = {"index": 0, "finish_reason": finish_reason, "message": {"role": "assistant", "content": text}}
    groups = [
        agentrl.TrajectoryGroup(
            agentrl.Trajectory(
                messages_and_choices=[{"role": "user", "content": "Count to five."}, {**choice, "completion_id": cid}],
                reward=r,
            )
            for cid, r in ((completion_id, 0.0), (completion_id, 1.0))
        )
    ]
    step = await served_model.get_step()
    result = await served_model.train(groups, agentrl.TrainConfig(learning_rate=1e-4))
    assert result.step == step + 1 and result.metrics["trained_tokens"] == 2 * len(streamed_ids)


async def test_a_token_guards_every_route_and_admin_routes_do_not_exist(served_model):
    gateway = Gateway(token="s3cret")
    gateway.connect(served_model.backend.server.gateway_replicas())
    await gateway.start()
    root = f"http://127.0.0.1:{gateway.port}"
    routes = [("GET", "/v1/models"), ("POST", "/v1/chat/completions"), ("POST", "/v1/completions"),
              ("GET", "/v1/sampled/x"), ("POST", "/v1/load_lora_adapter"), ("POST", "/sleep"),
              ("POST", "/collective_rpc")]  # fmt: skip
    try:
        async with httpx.AsyncClient(timeout=60) as client:
            for method, path in routes:
                for headers in ({}, {"Authorization": "Bearer wrong"}):
                    assert (await client.request(method, root + path, headers=headers)).status_code == 401, path
            good = {"Authorization": "Bearer s3cret"}
            models = await client.get(f"{root}/v1/models", headers=good)
            assert served_model.inference_name in {m["id"] for m in models.json()["data"]}
            for path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/sleep", "/collective_rpc"):
                assert (await client.post(root + path, headers=good, json={})).status_code == 404, path
            text = await client.post(
                f"{root}/v1/completions",
                headers=good,
                json={"model": served_model.inference_name, "prompt": "1, 2, 3,", "max_tokens": 4},
            )
            completion = text.json()
            assert text.status_code == 200 and completion["choices"][0]["token_ids"]
            kept = (await client.get(f"{root}/v1/sampled/{completion['id']}", headers=good)).json()
            assert kept[0]["token_ids"] == completion["choices"][0]["token_ids"]
    finally:
        await gateway.stop()


def test_beyond_loopback_a_token_is_required():
    with pytest.raises(agentrl.ConfigurationError, match="beyond loopback, without a token"):
        Gateway(host="0.0.0.0")


async def test_a_dead_upstream_is_reported_with_its_notice():
    gateway = Gateway()
    await gateway.start()
    try:
        async with httpx.AsyncClient(timeout=30) as client:
            request = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            response = await client.post(f"{gateway.base_url}/chat/completions", json=request)
            assert response.status_code == 503 and "no model is registered" in response.json()["error"]["message"]
            assert (await client.get(f"{gateway.base_url}/models")).json()["data"] == []
            notice = "the vLLM server exited with code 3; log ..."
            gateway.connect([Replica(f"http://127.0.0.1:{free_port()}", "k", death_notice=lambda: notice)])
            response = await client.post(f"{gateway.base_url}/chat/completions", json=request)
        assert response.status_code == 503 and "exited with code 3" in response.json()["error"]["message"]
    finally:
        await gateway.stop()


async def test_a_request_on_a_connection_the_server_closed_is_resent_once_and_only_once():
    """An upstream speaking raw HTTP/1.1: it reads each request, then either closes without a word (as a server
    whose keep-alive timeout fires as a pooled connection is reused) or answers as vLLM does."""
    plan: list[str] = []
    answer = {"id": "c", "object": "chat.completion", "model": "m", "prompt_token_ids": [1, 2],
              "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop",
                           "token_ids": [5], "logprobs": {"content": [{"token": "hi", "logprob": -0.1}]}}]}  # fmt: skip

    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
        )
        await reader.readexactly(length)
        if plan.pop(0) == "answer":
            body = json.dumps(answer).encode()
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body))
            writer.write(body)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(upstream, "127.0.0.1", 0)
    gateway = Gateway(token="t")
    await gateway.start()
    gateway.connect([Replica(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", "k", lambda: None)])
    request = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    try:
        async with httpx.AsyncClient(timeout=30, headers={"Authorization": "Bearer t"}) as client:
            plan[:] = ["close", "answer"]  # closed once: resent on a fresh connection, answered
            resent = await client.post(f"{gateway.base_url}/chat/completions", json=request)
            assert resent.status_code == 200 and resent.json()["choices"][0]["message"]["content"] == "hi"
            plan[:] = ["close", "close", "answer"]  # closed twice: a server that drops requests is reported
            dropped = await client.post(f"{gateway.base_url}/chat/completions", json=request)
            assert dropped.status_code == 503 and "did not answer" in dropped.json()["error"]["message"]
            assert plan == ["answer"]  # sent twice, never a third time
    finally:
        await gateway.stop()
        server.close()


def test_the_store_is_bounded_and_an_evicted_completion_names_the_fix():
    store = SampledStore(max_completions=2)
    for name in ("a", "b", "c"):
        store.put(name, [SampledChoice(prompt_token_ids=[1], token_ids=[2], logprobs=[-0.1])])
    assert len(store) == 2 and store.get("c")[0].token_ids == [2]
    with pytest.raises(agentrl.TokenizationError, match="evicted .* keeps the last 2"):
        store.get("a")
    choice = {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "x"}}
    group = agentrl.TrajectoryGroup([agentrl.Trajectory(messages_and_choices=[{**choice, "completion_id": "a"}])])
    with pytest.raises(agentrl.TokenizationError, match="'a'"):
        fill_sampled_tokens([group], store)
    json.dumps(store.get("b")[0].model_dump())  # what /v1/sampled returns is plain JSON
    by_tokens = SampledStore(max_tokens=10)  # long prompts: the token budget bounds memory, not the count
    for name in ("a", "b", "c"):
        by_tokens.put(name, [SampledChoice(prompt_token_ids=[1, 2, 3], token_ids=[4, 5], logprobs=[-0.1, -0.2])])
    assert len(by_tokens) == 2 and by_tokens.num_tokens == 10
    assert by_tokens.get("c")[0] == SampledChoice(prompt_token_ids=[1, 2, 3], token_ids=[4, 5], logprobs=[-0.1, -0.2])


async def test_a_blocking_client_is_answered_while_it_blocks_the_event_loop(served_model):
    """A notebook cell with the synchronous openai client blocks the loop it runs in; the gateway has its own."""
    gateway = served_model.backend.gateway
    client = openai.OpenAI(base_url=gateway.base_url, api_key=gateway.token, timeout=60)
    completion = client.chat.completions.create(  # no await: this blocks the test's event loop
        model=served_model.inference_name, messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    client.close()
    assert served_model.backend.gateway.store.get(completion.id)[0].token_ids


async def two_sampled_trajectories(model: agentrl.TrainableModel, prompt: str) -> agentrl.TrajectoryGroup:
    client = model.openai_client()
    trajectories = []
    for reward in (0.0, 1.0):
        completion = await client.chat.completions.create(
            model=model.inference_name, messages=[{"role": "user", "content": prompt}], max_tokens=8, temperature=1.0
        )
        trajectories.append(
            agentrl.Trajectory(
                messages_and_choices=[{"role": "user", "content": prompt}, completion.choices[0]], reward=reward
            )
        )
    return agentrl.TrajectoryGroup(trajectories)


async def test_two_models_train_on_one_backend_each_served_as_its_own(served_model, tmp_path):
    from peft import get_peft_model_state_dict

    backend = served_model.backend
    second = agentrl.TrainableModel(name="second", project="two-models", base_path=str(tmp_path))
    await second.register(backend)
    assert second.inference_name == "second@0" and backend.server.live  # the same server
    first_step = await served_model.get_step()

    for expected in (1, 2):
        groups = [await two_sampled_trajectories(second, "Say yes.")]
        result = await second.train(groups, agentrl.TrainConfig(learning_rate=1e-3))
        assert result.step == expected and await served_model.get_step() == first_step  # the first did not move
    result = await served_model.train(
        [await two_sampled_trajectories(served_model, "Say no.")], agentrl.TrainConfig(learning_rate=1e-3)
    )
    assert result.step == first_step + 1 and await second.get_step() == 2

    async with httpx.AsyncClient(timeout=30, headers={"Authorization": f"Bearer {backend.gateway.token}"}) as client:
        served = {m["id"] for m in (await client.get(f"{backend.gateway.base_url}/models")).json()["data"]}
    # Each model's adapter and the one before it (for requests that named it just before the swap).
    assert {"base", "second@2", "second@1", served_model.inference_name} <= served and "second@0" not in served
    assert sorted(p.name for p in (second.run_dir / "checkpoints").iterdir()) == ["0000", "0001", "0002"]
    assert not (served_model.run_dir / "checkpoints" / "0000" / "second").exists()
    trainer = backend.trainer
    first = get_peft_model_state_dict(trainer.model, adapter_name=backend.session(served_model).adapter)
    other = get_peft_model_state_dict(trainer.model, adapter_name=backend.session(second).adapter)
    assert first.keys() == other.keys() and any(not torch_equal(first[k], other[k]) for k in first)
    completion = await second.openai_client().chat.completions.create(
        model=second.inference_name, messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    assert completion.model == "second@2"
    again = agentrl.TrainableModel(name="second", project="two-models", base_path=str(tmp_path))
    assert await backend.register(again) == 2  # the same run again: its session, not a second lock


def torch_equal(a, b) -> bool:
    import torch

    return torch.equal(a, b)
