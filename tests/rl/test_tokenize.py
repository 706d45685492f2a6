"""rl/tokenize.py with the packaged model's real tokenizer.

The sampled ids are deliberately non-canonical (a word spelled letter by letter) where it matters:
a tokenizer that re-encoded the assistant's text would produce different ids and fail.
"""

import json

import pytest
import torch

from agentrl import TokenizationError, Trajectory, TrajectoryGroup
from agentrl.rl.engine_context import tokenize_groups
from agentrl.rl.micro_batches import collate, plan_micro_batches
from agentrl.rl.tokenize import tokenize_history
from tests.helpers import make_choice

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}]


def spelled(tokenizer, text: str) -> list[int]:
    """Ids for `text` one character at a time: valid, but not what encode(text) gives."""
    return [tokenizer.convert_tokens_to_ids(c) for c in text]


def end_id(tokenizer) -> int:
    return tokenizer.convert_tokens_to_ids("<|im_end|>")


def assistant_spans(seq):
    spans, current = [], []
    for token, in_loss in zip(seq.input_ids_T, seq.loss_mask_T):
        if in_loss:
            current.append(token)
        elif current:
            spans.append(current)
            current = []
    return spans + ([current] if current else [])


def test_single_turn_assistant_span_is_exactly_the_sampled_ids(tokenizer):
    sampled = spelled(tokenizer, "Hello") + [end_id(tokenizer)]
    assert sampled[:-1] != tokenizer.encode("Hello", add_special_tokens=False)
    logprobs = [-0.1, -0.2, -0.3, -0.4, -0.5, -0.6]
    traj = Trajectory(messages_and_choices=[{"role": "user", "content": "Greet me"}, make_choice(sampled, logprobs)])
    seq = tokenize_history(traj, tokenizer, advantage=0.7, group_index=3)
    assert assistant_spans(seq) == [sampled]
    assert [lp for lp, m in zip(seq.sampler_logprobs_T, seq.loss_mask_T) if m] == logprobs
    assert all(lp == 0.0 for lp, m in zip(seq.sampler_logprobs_T, seq.loss_mask_T) if not m)
    expected = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Greet me"}, {"role": "assistant", "content": "Hello"}], tokenize=False
    )
    assert tokenizer.decode(seq.input_ids_T, skip_special_tokens=False) == expected  # <|im_end|> not doubled
    assert (seq.advantage, seq.group_index) == (0.7, 3)


def test_multi_turn_every_sampled_turn_is_exact_and_user_turns_are_masked(tokenizer):
    first = spelled(tokenizer, "Yes") + [end_id(tokenizer)]
    second = tokenizer.encode("The answer is 4.", add_special_tokens=False) + [end_id(tokenizer)]
    traj = Trajectory(
        messages_and_choices=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Ready?"},
            make_choice(first),
            {"role": "user", "content": "What is 2+2?"},
            make_choice(second),
        ]
    )
    seq = tokenize_history(traj, tokenizer)
    assert assistant_spans(seq) == [first, second]
    masked_text = tokenizer.decode([t for t, m in zip(seq.input_ids_T, seq.loss_mask_T) if not m])
    assert "Be brief." in masked_text and "What is 2+2?" in masked_text and "Yes" not in masked_text
    rendered = tokenizer.apply_chat_template(
        [
            *traj.messages()[:2],
            {"role": "assistant", "content": "Yes"},
            traj.messages()[3],
            {"role": "assistant", "content": "The answer is 4."},
        ],
        tokenize=False,
    )
    assert tokenizer.decode(seq.input_ids_T) == rendered


def test_tool_call_turn_uses_the_sampled_call_text_not_the_template_rendering(tokenizer):
    call_text = '<tool_call>\n{"name": "lookup", "arguments": {}}\n</tool_call>'
    sampled = tokenizer.encode(call_text, add_special_tokens=False) + [end_id(tokenizer)]
    final = spelled(tokenizer, "Done") + [end_id(tokenizer)]
    tool_call = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    traj = Trajectory(
        tools=TOOLS,
        messages_and_choices=[
            {"role": "user", "content": "Look it up"},
            make_choice(sampled, content=None, tool_calls=[tool_call]),
            {"role": "tool", "tool_call_id": "call_1", "content": json.dumps({"result": 42})},
            make_choice(final),
        ],
    )
    seq = tokenize_history(traj, tokenizer)
    assert assistant_spans(seq) == [sampled, final]
    text = tokenizer.decode(seq.input_ids_T)
    after_user = text.split("Look it up", 1)[1]
    assert after_user.count("<tool_call>") == 1  # the sampled call, not a second copy from the template
    assert '<|im_start|>tool\n{"result": 42}<|im_end|>' in text
    assert "<tools>" in text  # the tool schemas are rendered into the masked prompt


def test_ids_spelled_as_token_id_strings_are_read(tokenizer):
    sampled = spelled(tokenizer, "Hi") + [end_id(tokenizer)]
    traj = Trajectory(messages_and_choices=[{"role": "user", "content": "x"}, make_choice(sampled, ids_as_tokens=True)])
    assert assistant_spans(tokenize_history(traj, tokenizer)) == [sampled]


def test_missing_logprobs_is_a_clear_error_or_a_counted_skip(tokenizer):
    good = Trajectory(
        reward=1.0, messages_and_choices=[{"role": "user", "content": "x"}, make_choice([42, end_id(tokenizer)])]
    )
    bare = make_choice([42]).model_copy(update={"logprobs": None})
    bad = Trajectory(reward=0.0, messages_and_choices=[{"role": "user", "content": "x"}, bare])
    groups = [TrajectoryGroup([good, bad])]
    with pytest.raises(TokenizationError, match=r"group 0, trajectory 1: .*openai_client"):
        tokenize_groups(groups, [[1.0, -1.0]], tokenizer)
    result = tokenize_groups(groups, [[1.0, -1.0]], tokenizer, allow_missing_logprobs=True)
    assert result.num_skipped_trajectories == 1
    assert [s.advantage for s in result.sequences] == [1.0]


def test_hand_written_assistant_turns_are_context_not_training_data(tokenizer):
    traj = Trajectory(
        messages_and_choices=[
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "an example answer"},
            {"role": "user", "content": "b"},
            make_choice([42, end_id(tokenizer)]),
        ]
    )
    seq = tokenize_history(traj, tokenizer)
    assert assistant_spans(seq) == [[42, end_id(tokenizer)]]


def test_additional_histories_become_sequences_with_the_same_advantage(tokenizer):
    from agentrl import History

    branch = History(messages_and_choices=[{"role": "user", "content": "summary"}, make_choice([7, end_id(tokenizer)])])
    traj = Trajectory(
        messages_and_choices=[{"role": "user", "content": "x"}, make_choice([42, end_id(tokenizer)])],
        additional_histories=[branch],
    )
    result = tokenize_groups([TrajectoryGroup([traj])], [[0.5]], tokenizer)
    assert [s.advantage for s in result.sequences] == [0.5, 0.5]


def test_collate_pads_right_and_broadcasts_advantages(tokenizer):
    a = tokenize_history(
        Trajectory(messages_and_choices=[{"role": "user", "content": "x"}, make_choice([42, 2])]),
        tokenizer,
        advantage=1.0,
        group_index=0,
    )
    b = tokenize_history(
        Trajectory(messages_and_choices=[{"role": "user", "content": "a longer prompt"}, make_choice([5, 6, 2])]),
        tokenizer,
        advantage=-1.0,
        group_index=1,
    )
    batch = collate([a, b], pad_token_id=0)
    assert batch.input_ids_BT.shape == (2, max(len(a), len(b)))
    assert batch.attention_mask_BT.sum().item() == len(a) + len(b)
    assert batch.num_loss_tokens == 5
    assert batch.advantages_BT[0].eq(1.0).all() and batch.advantages_BT[1].eq(-1.0).all()
    assert batch.group_ids_B.tolist() == [0, 1]
    assert batch.loss_mask_BT[0, len(a) :].sum() == 0


def test_micro_batches_respect_the_token_budget():
    lengths = [10, 300, 50, 60, 1000, 55]
    batches = plan_micro_batches(lengths, max_tokens=200)
    assert sorted(i for b in batches for i in b) == list(range(6))
    for batch in batches:
        padded = len(batch) * max(lengths[i] for i in batch)
        assert padded <= 200 or len(batch) == 1
    assert [4] in batches and [1] in batches  # too long for the budget: alone


def test_tokenize_output_dtypes(tokenizer):
    seq = tokenize_history(
        Trajectory(messages_and_choices=[{"role": "user", "content": "x"}, make_choice([42, 2])]), tokenizer
    )
    batch = collate([seq], pad_token_id=0)
    assert batch.input_ids_BT.dtype == torch.long and batch.sampler_logprobs_BT.dtype == torch.float32
