"""agentrl.mcp on real MCP servers (the official SDK, as child processes on stdio and over HTTP).

Fast tier: tools listed as OpenAI schemas, calls routed, every failure a documented result (a tool
error, a timeout, a dead server), no process left. Slow tier (the shared vLLM server): an agent
with MCP tools trains a step on its exact sampled tokens, over stdio and over HTTP; MCP-RL writes
tasks and trains two steps on the email inbox served over MCP.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import agentrl
from agentrl.backend.processes import free_port
from agentrl.mcp import (
    HTTPServer,
    MCPRLConfig,
    MCPToolbox,
    StdioServer,
    ToolServerError,
    generate_tasks,
    run_agent,
)
from tests.fake_openai import FakeOpenAI
from tests.helpers import assert_trains_on_exact_tokens, children

TEST_SERVER = [sys.executable, str(Path(__file__).with_name("mcp_tools_server.py"))]


def stdio(name: str | None = None) -> StdioServer:
    return StdioServer(command=TEST_SERVER[0], args=TEST_SERVER[1:], name=name)


async def assert_no_new_children(before: set[int], message: str = "a server outlived its toolbox") -> None:
    """Children started since `before` are gone within 10 s (a loaded 2-core machine reaps slowly)."""
    deadline = time.monotonic() + 10
    while children() - before and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert children() <= before, message


def wait_for_port(port: int, process: subprocess.Popen, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, "the MCP HTTP server exited"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"nothing listens on {port}")


@pytest.fixture
def http_server() -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen([*TEST_SERVER, "--port", str(port)], stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, process)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.kill()  # not terminate: uvicorn would wait for the hung tool's request
        process.wait(timeout=10)


async def test_stdio_tools_are_openai_schemas_and_every_failure_is_a_documented_result():
    before = children()
    # 3 s, not 1: this test failed once at 1 s in a fresh-clone run on a busy 2-core float32 CPU
    async with MCPToolbox([stdio()], tool_timeout_s=3.0) as toolbox:
        assert {"add", "crash", "hang", "die", "read_resource"} == set(toolbox.tool_names)
        assert children() - before, "the stdio server runs as a child process"
        add = next(t for t in toolbox.tools if t["function"]["name"] == "add")
        assert add["type"] == "function" and add["function"]["parameters"]["required"] == ["a", "b"]
        assert (await toolbox.call("add", '{"a": 2, "b": 3}')).content == "5"
        assert (await toolbox.call("read_resource", '{"uri": "notes://readme"}')).content == "the answer is 42"
        # What the model wrote wrong comes back to it as text.
        for name, arguments, says in [
            ("add", '{"a": 2}', "Field required"),
            ("add", "not json", "not valid JSON"),
            ("subtract", "{}", "unknown tool 'subtract'"),
            ("crash", "{}", "Error executing tool crash"),  # mcp 2 keeps an unexpected exception's text server-side
        ]:
            result = await toolbox.call(name, arguments)
            assert result.is_error and says in result.content and result.content.startswith("Error"), result
        # A hung tool times out, and the server still answers the next call.
        started = time.monotonic()
        hung = await toolbox.call("hang", "{}")
        assert hung.timed_out and hung.is_error and "did not answer within 3 s" in hung.content
        assert time.monotonic() - started < 20
        assert (await toolbox.call("add", '{"a": 1, "b": 1}')).content == "2"
        # A dead server raises, naming it, and stays dead.
        with pytest.raises(ToolServerError, match="is gone"):
            await toolbox.call("die", "{}")
        with pytest.raises(ToolServerError, match="is gone"):
            await toolbox.call("add", '{"a": 1, "b": 1}')
    await assert_no_new_children(before, "a stdio server outlived its toolbox")
    with pytest.raises(ToolServerError, match="closed"):
        await toolbox.call("add", '{"a": 1, "b": 1}')


async def test_tools_of_two_servers_route_to_their_owner_and_clashing_names_need_a_server_name():
    before = children()
    with pytest.raises(agentrl.ConfigurationError, match="give each server a name="):
        async with MCPToolbox([stdio(), stdio()]):
            pass
    async with MCPToolbox([stdio("one"), stdio("two")]) as toolbox:
        assert "add" in toolbox.tool_names and "two_add" in toolbox.tool_names
        assert (await toolbox.call("two_add", {"a": 4, "b": 5})).content == "9"
    await assert_no_new_children(before)


async def test_a_server_that_cannot_start_or_be_reached_is_a_clear_error_with_nothing_left_running():
    before = children()
    broken = StdioServer(
        command=sys.executable, args=["-c", "import sys; sys.exit('boom: no MCP here')"], name="broken"
    )
    with pytest.raises(ToolServerError, match="could not connect to MCP server 'broken'(.|\n)*boom: no MCP here"):
        async with MCPToolbox([broken]):
            pass
    with pytest.raises(ToolServerError, match="could not connect"):
        async with MCPToolbox([HTTPServer(url=f"http://127.0.0.1:{free_port()}/mcp")], connect_timeout_s=5):
            pass
    with pytest.raises(agentrl.ConfigurationError, match="StdioServer"):
        MCPToolbox(["python server.py"])  # type: ignore[list-item]
    await assert_no_new_children(before)


async def test_streamable_http_tools(http_server):
    async with MCPToolbox([HTTPServer(url=http_server)], tool_timeout_s=3.0) as toolbox:
        assert (await toolbox.call("add", '{"a": 20, "b": 22}')).content == "42"
        assert (await toolbox.call("crash", "{}")).is_error
        assert (await toolbox.call("hang", "{}")).timed_out


# --- on the shared vLLM server --------------------------------------------------------------------


FORCED_ADD = "Call the add tool with a=2 and b=3, then answer with the sum."


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_an_agent_with_mcp_tools_trains_a_step_on_exact_tokens(served_model, transport, request):
    servers = [stdio()] if transport == "stdio" else [HTTPServer(url=request.getfixturevalue("http_server"))]
    before = children()
    async with MCPToolbox(servers) as toolbox:  # one session shared by the group's rollouts
        trajectories = await asyncio.gather(
            *(
                run_agent(served_model, toolbox, [{"role": "user", "content": FORCED_ADD}], max_turns=2, max_tokens=48)
                for _ in range(3)
            )
        )
    for reward, trajectory in enumerate(trajectories):
        trajectory.reward = float(reward)
        assert 1 <= trajectory.metrics["turns"] <= 2 and trajectory.tools == toolbox.tools
        for message in trajectory.messages():
            if message["role"] == "tool":  # a tool result answers a call the model made
                assert message["content"] == "5" or message["content"].startswith("Error")
    await assert_trains_on_exact_tokens(served_model, list(trajectories))
    await assert_no_new_children(before)


async def test_a_local_task_writer_is_held_to_the_count_it_was_asked_for_and_a_hosted_one_is_not():
    """A small local writer sampling a list can keep adding tasks until max_tokens; its schema bounds the list."""
    fake = FakeOpenAI()
    tools = [{"type": "function", "function": {"name": "search", "description": "search mail", "parameters": {}}}]
    try:
        local = agentrl.Model(name="base", base_url=fake.base_url, api_key="test", litellm_provider="hosted_vllm")
        tasks = await generate_tasks(tools, 8, local)
        asked = [r["response_format"]["json_schema"]["schema"] for r in fake.requests]
        assert sorted(s["properties"]["tasks"]["maxItems"] for s in asked) == [2, 6] and len(tasks) == 8
        assert all(s["properties"]["tasks"]["minItems"] == 1 for s in asked)  # an empty list cannot be decoded
        fake.requests.clear()
        await generate_tasks(tools, 2, agentrl.Model(name="gpt-4.1-mini", base_url=fake.base_url, api_key="test"))
        (hosted,) = [r["response_format"]["json_schema"]["schema"] for r in fake.requests]
        assert "maxItems" not in hosted["properties"]["tasks"] and "maxLength" not in json.dumps(hosted)
        assert "minItems" not in hosted["properties"]["tasks"]
    finally:
        fake.close()


@pytest.mark.slow
async def test_mcp_rl_writes_tasks_and_trains_two_steps_on_the_email_inbox_over_mcp(served_model):
    from agentrl_environments.email_agent import mcp_rl

    config = MCPRLConfig(
        steps=2,
        tasks_per_step=1,
        group_size=2,
        num_eval_tasks=2,
        max_turns=2,
        max_tokens=64,
        system_prompt=mcp_rl.SYSTEM_PROMPT,
        custom_instructions=mcp_rl.CUSTOM_INSTRUCTIONS,
    )
    # The packaged 135M model judges at chance and ties every group (no step would train), so RULER's
    # judge here is a hosted model faked at its HTTP boundary; the task writer is the real packaged model.
    fake = FakeOpenAI(score_mode="position")
    judge = agentrl.Model(name="gpt-4.1-mini", base_url=fake.base_url, api_key="test")
    step = await served_model.get_step()
    before = children()
    try:
        report = await mcp_rl.run(served_model, config=config, judge=judge, warm_start_examples=1)
    finally:
        fake.close()
    assert len(report.train_tasks) == 2 and all(t.task.strip() for t in report.train_tasks)
    assert [t.metadata["answer"] for t in report.eval_tasks] and len(report.eval_tasks) == 2
    assert len(report.step_metrics) == 2 and await served_model.get_step() == step + 3  # warm start + 2 steps
    assert report.check_before is not None and report.check_before.n == 2 and report.check_after.n == 2
    assert 0.0 <= report.check_before.mean <= 1.0 and 0.0 <= report.check_after.mean <= 1.0
    assert report.ruler_before is not None and report.ruler_before.n == report.ruler_after.n == 2
    assert report.calls_before is not None and report.calls_before.n == report.calls_after.n == 2
    assert "held-out tool calls a rollout:" in report.summary()
    written = [json.loads(line) for line in (served_model.run_dir / "mcp_train_tasks.jsonl").read_text().splitlines()]
    assert [w["task"] for w in written] == [t.task for t in report.train_tasks]
    print(report.summary())
    await assert_no_new_children(before, "a per-rollout stdio server outlived its rollout")
