"""The email agent's world: deterministic data, SQLite FTS5 search that never breaks or leaks, tools, reward."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrl.rl.tokenize import tokenize_history
from agentrl_environments.email_agent.data import generate
from agentrl_environments.email_agent.env import demonstration
from agentrl_environments.email_agent.grading import RolloutStats, grade_answer, is_dont_know, reward
from agentrl_environments.email_agent.mailbox import Mailbox, build_database, fts_query
from agentrl_environments.email_agent.tools import execute


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from agentrl_environments.email_agent.env import EmailEnvironment

    data = generate(seed=0)
    database = build_database(data, tmp_path_factory.mktemp("mail") / "inboxes.sqlite")
    return EmailEnvironment(data, database)


def test_generation_is_deterministic_and_split_by_inbox():
    a, b = generate(seed=0), generate(seed=0)
    assert a.emails == b.emails and a.questions == b.questions
    assert generate(seed=1).emails != a.emails
    train_inboxes = {q.inbox for q in a.split("train")}
    test_inboxes = {q.inbox for q in a.split("test")}
    assert train_inboxes and test_inboxes and not train_inboxes & test_inboxes
    for q in a.questions:  # every answer is a fact written in its source email
        (source,) = [e for e in a.emails if e.message_id == q.source_ids[0]]
        assert q.answer in source.body and source.inbox == q.inbox


def test_search_finds_the_source_email(world):
    q = world.data.split("test")[0]
    box = Mailbox(world.database, q.inbox)
    hits = box.search(q.question.split(" from ")[-1].rstrip("?") if " from " in q.question else q.answer)
    assert q.source_ids[0] in {h.message_id for h in hits}
    box.close()


@pytest.mark.parametrize(
    "hostile",
    [
        '"unbalanced',
        "OR",
        "NEAR(a b)",
        "*",
        "-- drop table messages",
        "a AND OR NOT",
        "subject:x",
        "'; DROP TABLE messages; --",
        "((((",
        "^start",
        "\x00",
        "",
    ],
)
def test_hostile_searches_return_results_or_nothing_never_raise(world, hostile):
    box = Mailbox(world.database, world.data.inboxes[0])
    assert isinstance(box.search(hostile), list)
    assert isinstance(box.search("invoice", sent_after=hostile, from_addr=hostile), list)
    box.close()


def test_fts_query_quotes_every_word():
    assert fts_query('flight "UA" OR 482*') == '"flight" "UA" "OR" "482"'
    assert fts_query("--") is None


def test_an_inbox_never_sees_another_inboxs_mail(world):
    first, second = world.data.inboxes[:2]
    other_email = next(e for e in world.data.emails if e.inbox == second)
    box = Mailbox(world.database, first)
    assert box.read(other_email.message_id) is None
    assert all(h.message_id.startswith("<00.") for h in box.search("the"))
    box.close()


def test_tools_answer_malformed_calls_with_recoverable_errors(world):
    box = Mailbox(world.database, world.data.inboxes[0])
    assert execute(box, "delete_everything", "{}").malformed
    assert "not valid JSON" in execute(box, "search_emails", "{keywords: x").content
    assert "needs the argument 'keywords'" in execute(box, "search_emails", "{}").content
    assert "needs the argument 'message_id'" in execute(box, "read_email", json.dumps({"id": 1})).content
    assert "No email" in execute(box, "read_email", json.dumps({"message_id": "<nope>"})).content
    final = execute(box, "return_final_answer", json.dumps({"answer": "42", "sources": "<a>"}))
    assert final.final_answer == "42" and final.sources == ("<a>",) and not final.malformed
    box.close()


def test_reward_orders_correct_above_dont_know_above_wrong(world):
    q = world.data.split("train")[0]
    correct = RolloutStats(
        turns=3, answer=q.answer, sources=q.source_ids, found_source=True, read_source=True, correct=True
    )
    unsure = RolloutStats(turns=3, answer="I don't know", found_source=True, read_source=True)
    wrong = RolloutStats(turns=3, answer="banana", found_source=True, read_source=True)
    none = RolloutStats(turns=4)
    assert reward(correct, q, 4) > reward(unsure, q, 4) > reward(wrong, q, 4) > reward(none, q, 4) == 0
    uncited = RolloutStats(turns=3, answer=q.answer, correct=True)
    assert reward(correct, q, 4) > reward(uncited, q, 4)
    faster = RolloutStats(turns=2, answer=q.answer, sources=q.source_ids, correct=True)
    slower = RolloutStats(turns=4, answer=q.answer, sources=q.source_ids, correct=True)
    assert reward(faster, q, 4) > reward(slower, q, 4)
    sloppy = RolloutStats(
        turns=3,
        answer=q.answer,
        sources=q.source_ids,
        found_source=True,
        read_source=True,
        malformed_calls=2,
        correct=True,
    )
    assert reward(sloppy, q, 4) == pytest.approx(reward(correct, q, 4) - 0.1)
    assert is_dont_know("I do not know.") and not is_dont_know("I know it: $40")


def test_demonstrations_train_exactly_the_assistant_tool_calls(world, tokenizer):
    q = world.data.split("train")[0]
    demo = demonstration(q, world)
    seq = tokenize_history(demo, tokenizer, train_on_written_assistant=True)
    trained = tokenizer.decode([t for t, m in zip(seq.input_ids_T, seq.loss_mask_T) if m])
    assert trained.count("<tool_call>") == 3 and trained.count("<|im_end|>") == 3
    assert '"name": "return_final_answer"' in trained and q.answer in trained
    assert q.question not in trained  # the question is context
    context_only = tokenize_history(demo, tokenizer)  # without the flag, written turns are not trained
    assert not any(context_only.loss_mask_T)


async def test_free_text_answers_are_graded_by_a_judge_when_one_is_given(world):
    """Exact (normalised) matches need no judge; other answers go to the judge; "I don't know" never does."""
    import agentrl
    from tests.fake_openai import FakeOpenAI

    q = world.data.split("train")[0]
    fake = FakeOpenAI()
    judge = agentrl.Model(name="judge", base_url=fake.base_url, api_key="test")
    try:
        assert await grade_answer(f"It is {q.answer}.", q, judge) and not fake.requests
        assert not await grade_answer("said differently", q)  # no judge: exact match only
        fake.verdict = "Yes"
        assert await grade_answer("said differently", q, judge)
        assert q.answer in json.dumps(fake.requests[-1]["messages"])  # the judge sees the reference fact
        fake.verdict = "No"
        assert not await grade_answer("something else", q, judge)
        assert not await grade_answer("I don't know", q, judge) and len(fake.requests) == 2
    finally:
        fake.close()


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
ARGUMENTS = st.one_of(
    st.dictionaries(
        st.sampled_from(
            [
                "keywords",
                "from_addr",
                "to_addr",
                "sent_after",
                "sent_before",
                "max_results",
                "message_id",
                "answer",
                "sources",
                "other",
            ]
        ),
        JSON_VALUES,
        max_size=6,
    ).map(lambda d: json.dumps(d, allow_nan=True)),
    JSON_VALUES.map(lambda v: json.dumps(v, allow_nan=True)),
    st.integers(1, 50_000).map(lambda depth: "[" * depth + "]" * depth),
    st.integers(1, 6000).map(lambda digits: '{"keywords": "x", "max_results": 1' + "0" * digits + "}"),
    st.text(max_size=60),
)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(["search_emails", "read_email", "return_final_answer"]), arguments=ARGUMENTS)
def test_email_tools_never_raise_on_1000_random_calls(world, name, arguments):
    from agentrl_environments.email_agent.mailbox import Mailbox

    box = Mailbox(world.database, world.data.inboxes[0])
    try:
        outcome = execute(box, name, arguments)
    finally:
        box.close()
    assert isinstance(outcome.content, str) and outcome.content
