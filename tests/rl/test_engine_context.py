"""rl/engine_context.py with the packaged model's real tokenizer: each sampled turn trained in the prompt ids the
engine sampled it from. The engine's prompts here are rendered the way vLLM renders them (the chat template over
the parsed conversation), and the sampled ids are what a model emits but a re-rendering does not reproduce."""

import asyncio
import json

import pytest

import agentrl
from agentrl import TokenizationError, Trajectory, TrajectoryGroup
from agentrl.rl.engine_context import engine_sequences, history_sequences, tokenize_groups
from agentrl.rl.packing import TokenTrie, pack_rows
from agentrl.rl.tokenize import SampledTokens, served_tool_order, tokenize_history
from tests.helpers import loss_runs, make_choice

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
    },
}
SYSTEM = {"role": "system", "content": "Use the add tool."}
USER = {"role": "user", "content": "What is 2 + 3?"}


def engine_prompt(tokenizer, messages, tools=None) -> list[int]:
    """The prompt vLLM renders for a chat request: the template over the parsed messages, tools as it dumps them."""
    text = tokenizer.apply_chat_template(
        messages, tools=served_tool_order(tools), tokenize=False, add_generation_prompt=True
    )
    return tokenizer.encode(text, add_special_tokens=False)


def end_id(tokenizer) -> int:
    return tokenizer.convert_tokens_to_ids("<|im_end|>")


def tool_conversation(tokenizer, tools=(ADD,)):
    """Two turns: a tool call sampled with extra whitespace (which the server parses and the client sends back as
    JSON, so the next prompt re-renders it), then an answer."""
    tools = list(tools)
    call_text = '<tool_call>\n{"name": "add",  "arguments": {"a": 2}}\n</tool_call>'
    sampled_call = tokenizer.encode(call_text, add_special_tokens=False) + [end_id(tokenizer)]
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2}'}}
    prompt_1 = engine_prompt(tokenizer, [SYSTEM, USER], tools)
    parsed = {"role": "assistant", "content": None, "tool_calls": [call]}
    result = {"role": "tool", "tool_call_id": "c1", "content": "5"}
    prompt_2 = engine_prompt(tokenizer, [SYSTEM, USER, parsed, result], tools)
    answer = tokenizer.encode("The sum is 5.", add_special_tokens=False) + [end_id(tokenizer)]
    history = Trajectory(
        tools=tools,
        messages_and_choices=[
            SYSTEM,
            USER,
            make_choice(sampled_call, content=None, tool_calls=[call], prompt_token_ids=prompt_1),
            result,
            make_choice(answer, content="The sum is 5.", prompt_token_ids=prompt_2),
        ],
    )
    return history, (prompt_1, sampled_call), (prompt_2, answer)


def test_a_tool_call_sent_back_parsed_is_trained_in_the_prompt_the_engine_rendered_not_a_re_rendering(tokenizer):
    history, (prompt_1, call), (prompt_2, answer) = tool_conversation(tokenizer)
    assert prompt_2[: len(prompt_1) + len(call)] != prompt_1 + call, "the re-rendered call is not what was sampled"
    old = tokenize_history(history, tokenizer)  # the re-rendering the trainer used before
    assert old.input_ids_T[: loss_runs(old)[1][0]] != prompt_2, "the re-rendering is not the engine's context"

    tokenized = history_sequences(history, tokenizer, advantage=0.5, group_index=2)
    assert (tokenized.num_turns, tokenized.num_exact_turns) == (2, 2)
    first, second = tokenized.sequences
    assert first.input_ids_T == prompt_1 + call and second.input_ids_T == prompt_2 + answer
    assert loss_runs(first) == [(len(prompt_1), len(prompt_1) + len(call))]
    assert loss_runs(second) == [(len(prompt_2), len(prompt_2) + len(answer))]
    assert [lp for lp, m in zip(second.sampler_logprobs_T, second.loss_mask_T) if m] == [-0.5] * len(answer)
    assert {(s.advantage, s.group_index) for s in tokenized.sequences} == {(0.5, 2)}
    trie = TokenTrie()
    for sequence in tokenized.sequences:
        trie.add(sequence.input_ids_T)
    assert len(trie) < len(first) + len(second), "the two turns' sequences share the system prompt and question"


def test_a_turn_whose_prompt_extends_the_sequence_continues_it(tokenizer):
    first = tokenizer.encode("Yes", add_special_tokens=False) + [end_id(tokenizer)]
    prompt_1 = engine_prompt(tokenizer, [USER])
    follow_up = {"role": "user", "content": "And 4 + 4?"}
    prompt_2 = engine_prompt(tokenizer, [USER, {"role": "assistant", "content": "Yes"}, follow_up])
    second = tokenizer.encode("Eight", add_special_tokens=False) + [end_id(tokenizer)]
    history = Trajectory(
        messages_and_choices=[
            USER,
            make_choice(first, content="Yes", prompt_token_ids=prompt_1),
            follow_up,
            make_choice(second, content="Eight", prompt_token_ids=prompt_2),
        ]
    )
    (sequence,) = history_sequences(history, tokenizer).sequences
    assert sequence.input_ids_T == prompt_2 + second, "one sequence, as before"
    assert [sequence.input_ids_T[a:b] for a, b in loss_runs(sequence)] == [first, second]
    rendered = tokenize_history(history, tokenizer)  # where the re-rendering is exact, the same but its masked tail
    assert rendered.input_ids_T[: len(sequence)] == sequence.input_ids_T
    assert rendered.loss_mask_T[: len(sequence)] == sequence.loss_mask_T and not any(
        rendered.loss_mask_T[len(sequence) :]
    )


def test_turns_without_engine_prompts_are_re_rendered_counted_and_refused_when_strict(tokenizer):
    history, (prompt_1, call), (_, answer) = tool_conversation(tokenizer)
    mixed = history.model_copy(deep=True)
    last = mixed.messages_and_choices[-1]
    mixed.messages_and_choices[-1] = make_choice(answer, content=last.message.content)  # no prompt ids
    tokenized = history_sequences(mixed, tokenizer)
    assert (tokenized.num_turns, tokenized.num_exact_turns) == (2, 1)
    exact, rendered = tokenized.sequences
    assert exact.input_ids_T == prompt_1 + call
    assert [rendered.input_ids_T[a:b] for a, b in loss_runs(rendered)] == [answer], "only the unknown turn trains"

    groups = [TrajectoryGroup([history, mixed])]
    counted = tokenize_groups(groups, [[1.0, -1.0]], tokenizer)
    assert (counted.num_turns, counted.num_exact_turns, counted.num_histories) == (4, 3, 2)
    assert [s.history_index for s in counted.sequences] == [0, 0, 1, 1]
    with pytest.raises(
        TokenizationError, match=r"trajectory 1, history 0: 1 of 2 sampled turns .*require_exact_context"
    ):
        tokenize_groups(groups, [[1.0, -1.0]], tokenizer, require_exact_context=True)
    with pytest.raises(TokenizationError, match="require_exact_context"):  # never skipped as missing data
        tokenize_groups(groups, [[1.0, -1.0]], tokenizer, allow_missing_logprobs=True, require_exact_context=True)


def test_a_forged_prompt_id_outside_the_vocabulary_is_refused(tokenizer):
    from agentrl.rl.tokenize import check_token_ids, labelled_histories

    history, (prompt_1, call), _ = tool_conversation(tokenizer)
    history.messages_and_choices[2] = make_choice(call, prompt_token_ids=[*prompt_1, len(tokenizer) + 5])
    with pytest.raises(TokenizationError, match="outside the model's vocabulary"):
        check_token_ids(labelled_histories([TrajectoryGroup([history])]), len(tokenizer))
    history.messages_and_choices[2] = make_choice(call, prompt_token_ids=["1"])  # type: ignore[list-item]
    with pytest.raises(TokenizationError, match="prompt_token_ids must be a list of whole numbers"):
        history_sequences(history, tokenizer)


@pytest.mark.parametrize("order", [("name", "description", "parameters"), ("parameters", "description", "name")])
def test_tools_in_any_key_order_re_render_as_the_engine_rendered_them(tokenizer, order):
    """vLLM hands the template each function as its pydantic model dumps it (name, description, parameters;
    a missing description as null), whatever order the client sent."""
    sent = [{"type": "function", "function": {key: ADD["function"][key] for key in order}}]
    bare = [{"type": "function", "function": {"parameters": ADD["function"]["parameters"], "name": "add"}}]
    for tools in (sent, bare):
        served = served_tool_order(tools)
        assert list(served[0]["function"]) == ["name", "description", "parameters"]
        turn = make_choice([end_id(tokenizer)], content="")
        history = Trajectory(tools=tools, messages_and_choices=[USER, turn])
        rendered = tokenize_history(history, tokenizer)
        assert rendered.input_ids_T[: loss_runs(rendered)[0][0]] == engine_prompt(tokenizer, [USER], served)
    assert '"description": null' in tokenizer.decode(engine_prompt(tokenizer, [USER], bare))


def test_a_k_turn_tool_conversation_packs_to_little_more_than_its_last_turn(tokenizer):
    """Every turn re-rendered differently (a branch per turn): the conversation's sequences still share their
    common context in one packed row, so it costs its last sequence plus the branches' sampled tokens."""
    calls, turns, messages = [], [], [SYSTEM, USER]
    for k in range(8):
        sampled = tokenizer.encode(f'<tool_call>\n{{"name": "add",  "arguments": {{"a": {k}}}}}\n</tool_call>')
        prompt = engine_prompt(tokenizer, messages, [ADD])
        turns.append(SampledTokens(sampled + [end_id(tokenizer)], [-0.5] * (len(sampled) + 1), prompt))
        call = {"id": f"c{k}", "type": "function", "function": {"name": "add", "arguments": json.dumps({"a": k})}}
        calls.append(call)
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{k}", "content": json.dumps({"result": k + 2, "note": "x" * 80})},
        ]
    sequences = engine_sequences(turns, advantage=1.0, group_index=0)
    assert len(sequences) == 8, "each re-rendered call starts a branch"
    units = [0] * len(sequences)
    rows, nodes = pack_rows([s.input_ids_T for s in sequences], [0] * 8, max_nodes=2048, units=units)
    assert rows == [list(range(8))], "one row: the conversation is never split across rows"
    branches = sum(len(t.token_ids) for t in turns[:-1])
    assert nodes[0] <= len(sequences[-1]) + branches
    assert nodes[0] <= 1.3 * len(sequences[-1]), (nodes[0], len(sequences[-1]))
    # Two conversations of one group that would overflow the budget together take a row each, whole.
    other = [[7, *s.input_ids_T] for s in sequences]  # another conversation of the group: nothing shared
    both = [s.input_ids_T for s in sequences] + other
    rows, _ = pack_rows(both, [0] * 16, max_nodes=nodes[0] + 10, units=[0] * 8 + [1] * 8)
    assert rows == [list(range(8)), list(range(8, 16))]


def test_new_nodes_counts_what_several_sequences_would_add_together():
    trie = TokenTrie()
    trie.add([1, 2, 3])
    assert trie.new_nodes([1, 2, 4], [1, 2, 4, 5]) == 2
    assert trie.new_nodes([1, 2, 3]) == 0 and trie.new_nodes([9], [9]) == 1


# --- on the real server: the engine's own prompts, through the gateway ---------------------------------------------

REVERSED_ADD = [
    {"type": "function", "function": {k: ADD["function"][k] for k in ("parameters", "description", "name")}}
]


async def _tool_conversation(model, tools, *, stream: bool) -> Trajectory:
    """A forced tool call (vLLM writes it under a grammar), its result sent back parsed, then a free answer,
    streamed or not: the plain openai client, as a user writes it."""
    client = model.openai_client()
    trajectory = Trajectory(messages_and_choices=[SYSTEM, USER], tools=tools)
    first = await client.chat.completions.create(
        model=model.inference_name, messages=trajectory.messages(), tools=tools, tool_choice="required",
        max_tokens=48, temperature=1.0,
    )  # fmt: skip
    choice = first.choices[0]
    trajectory.messages_and_choices.append(choice)
    for call in choice.message.tool_calls or []:
        trajectory.messages_and_choices.append({"role": "tool", "tool_call_id": call.id, "content": "5"})
    if not choice.message.tool_calls:  # cut off before the call closed: the conversation goes on all the same
        trajectory.messages_and_choices.append({"role": "user", "content": "Say the sum."})
    request = {"model": model.inference_name, "messages": trajectory.messages(), "tools": tools, "max_tokens": 16}
    if not stream:
        trajectory.messages_and_choices.append((await client.chat.completions.create(**request)).choices[0])
        return trajectory
    from agentrl.client.capture import capture_trajectory

    with capture_trajectory() as captured:  # a stream's turn is joined back by capture, as agent frameworks need
        async for _ in await client.chat.completions.create(**request, stream=True):
            pass
    trajectory.messages_and_choices.append(captured.choices()[-1])
    return trajectory


async def test_two_turn_tool_conversations_train_in_the_engines_prompts_whatever_the_tools_key_order(served_model):
    """Tools offered in vLLM's key order and reversed, the second turn whole or streamed: every turn of every
    trajectory is scored in exactly the prompt ids vLLM sampled it from (the re-rendering was not, after a call)."""
    from agentrl.backend.sampled_tokens import fill_sampled_tokens
    from tests.helpers import assert_context_exact, assert_trains_on_exact_tokens

    backend = served_model._backend
    trajectories = await asyncio.gather(
        *(
            _tool_conversation(served_model, tools, stream=stream)
            for tools in ([ADD], REVERSED_ADD)
            for stream in (False, True)
        )
    )
    for reward, trajectory in enumerate(trajectories):
        trajectory.reward = float(reward % 2)
    (filled,) = fill_sampled_tokens([TrajectoryGroup(trajectories)], backend.gateway.store)
    tokenizer = backend.trainer.tokenizer
    differs = []  # what the trainer did before: re-render, and lose the engine's context after a parsed call
    for trajectory in filled.trajectories:
        rendered = tokenize_history(trajectory, tokenizer)
        second = trajectory.choices()[1]
        differs.append(rendered.input_ids_T[: loss_runs(rendered)[1][0]] != second.model_extra["prompt_token_ids"])
    assert any(differs), "a call cut off before it closed re-renders as sampled; a parsed one does not"
    assert assert_context_exact(trajectories, backend.gateway.store, tokenizer) == 8
    await assert_trains_on_exact_tokens(served_model, list(trajectories))


async def test_a_turn_without_its_engine_prompt_is_counted_shown_and_refused_when_strict(served_model, tmp_path):
    """A Choice whose completion the gateway cannot name trains in the re-rendered context, counted in the step's
    metrics and `agentrl show`; `require_exact_context=True` refuses the step and nothing of it is applied."""
    from agentrl.cli import app
    from tests.helpers import flat, runner

    client = served_model.openai_client()

    async def one_turn(reward: float, *, known: bool) -> Trajectory:
        completion = await client.chat.completions.create(
            model=served_model.inference_name, messages=[USER], max_tokens=8, temperature=1.0
        )
        choice = completion.choices[0]
        if not known:  # as a client that kept the tokens but not the completion id would hand it over
            choice = type(choice).model_validate({**choice.model_dump(), "completion_id": None})
        return Trajectory(messages_and_choices=[USER, choice], reward=reward)

    trajectories = [await one_turn(0.0, known=True), await one_turn(1.0, known=False)]
    step = await served_model.get_step()
    with pytest.raises(TokenizationError, match="require_exact_context"):
        await served_model.train([TrajectoryGroup(trajectories)], agentrl.TrainConfig(require_exact_context=True))
    assert await served_model.get_step() == step, "the refused step applied nothing"
    result = await served_model.train([TrajectoryGroup(trajectories)], agentrl.TrainConfig(learning_rate=1e-5))
    assert (result.metrics["sampled_turns"], result.metrics["context_exact_turns"]) == (2, 1)
    shown = flat(runner.invoke(app, ["show", str(served_model.run_dir)]).output)
    assert f"{result.step} train" in shown and " 1/2 " in shown
    assert f"re-rendered context in steps [{result.step}]" in shown and "context-exact turns" in shown
