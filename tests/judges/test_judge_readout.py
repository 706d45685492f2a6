"""Judge decisions read from next-token probabilities: scores from a fake judge's planted first-token
logprobs (computed here by hand), a planted first-position bias cancelled by asking each pair both ways,
the JSON path for a judge that returns no logprobs, and the one-token loss of a decision demonstration."""

import logging
import re

import pytest
from openai.types.chat.chat_completion import Choice

import agentrl
from agentrl.judge_training import train_judge, train_judge_rl
from agentrl.judge_training.decisions import decision_histories, ordered_pairs
from agentrl.judges.audit import JudgeAudit
from agentrl.judges.examples import JudgeExample
from agentrl.judges.readout import probabilities_supported
from agentrl.judges.rubric import judge_rubrics
from agentrl.judges.ruler import ruler
from agentrl.records.judge_warning import audit_warning
from agentrl.rl.tokenize import tokenize_history


def attempt(quality: float) -> list[dict[str, str]]:
    return [{"role": "user", "content": "Task."}, {"role": "assistant", "content": f"An attempt, quality={quality}."}]


def shown_qualities(request: dict) -> tuple[float, float]:
    """The qualities of attempts A and B in a pairwise judge's prompt."""
    prompt = request["messages"][-1]["content"]
    found = [re.search(rf'<attempt id="{x}">.*?quality=([\d.]+)\.', prompt, flags=re.S) for x in ("A", "B")]
    assert all(found), prompt
    return float(found[0].group(1)), float(found[1].group(1))  # type: ignore[union-attr]


async def test_scores_are_read_from_the_first_token_probabilities_both_orders_averaged(fake, judge):
    def probabilities(request: dict) -> dict[str, float]:
        first, second = shown_qualities(request)
        # " A" is A too; "Sure" is no answer and drops out: P(A) = 0.6 / 0.8 = 0.75 when A is better,
        # 0.1 / 0.5 = 0.2 when B is.
        if first > second:
            return {"A": 0.5, " A": 0.1, "B": 0.2, "Sure": 0.2}
        return {"A": 0.1, "B": 0.3, " B": 0.1, "Sure": 0.5}

    fake.first_token_probabilities = probabilities
    result = await ruler([attempt(0.1), attempt(0.9), attempt(0.5)], judge, readout="probabilities")
    better = (0.75 + (1 - 0.2)) / 2  # the better attempt's preference: shown first, then shown second
    assert result.scores == pytest.approx([1 - better, better, 0.5])
    assert result.read_from_probabilities
    assert result.order_metrics == {"judge_pair_flip_rate": 0.0, "judge_first_position_rate": 0.5}
    assert len(fake.requests) == 6  # 3 pairs, both orders
    tied = await ruler([attempt(0.4), attempt(0.4)], judge, readout="probabilities")
    assert tied.scores == [0.5, 0.5] and tied.read_from_probabilities and len(fake.requests) == 6, "a tie: no call"
    for request in fake.requests:
        assert request["max_tokens"] == 1 and request["logprobs"] is True and request["top_logprobs"] == 20
        assert "response_format" not in request
    assert {shown_qualities(r) for r in fake.requests} == {
        (a, b) for a in (0.1, 0.9, 0.5) for b in (0.1, 0.9, 0.5) if a != b
    }


async def test_a_planted_first_position_bias_is_cancelled_and_measured(fake, judge):
    # The attempt shown first always wins; only by how much tells the better one: 0.9 against 0.7.
    fake.first_token_probabilities = lambda r: (
        {"A": 0.9, "B": 0.1} if shown_qualities(r)[0] > shown_qualities(r)[1] else {"A": 0.7, "B": 0.3}
    )
    qualities = [0.4, 0.9, 0.1, 0.7]
    group = agentrl.TrajectoryGroup(agentrl.Trajectory(reward=q, messages_and_choices=attempt(q)) for q in qualities)
    judged = await agentrl.ruler_score_group(group, judge, readout="probabilities", audit=JudgeAudit(fraction=1.0))
    # Preference of the better of a pair: (0.9 + (1 - 0.7)) / 2 = 0.6; a score is the mean over the other three.
    by_rank = {0.1: 0.4, 0.4: (0.6 + 0.4 + 0.4) / 3, 0.7: (0.6 + 0.6 + 0.4) / 3, 0.9: 0.6}
    assert judged.rewards == pytest.approx([by_rank[q] for q in qualities])
    metrics = judged.metrics
    assert (
        metrics["judge_first_position_rate"] == 1.0
        and metrics["judge_pair_flip_rate"] == 1.0
        and "judge_flip_rate" not in metrics
    )
    assert metrics["judge_first_position_chance"] == 0.5 and metrics["judge_independent_tau"] == pytest.approx(1.0)
    assert metrics["judge_read_from_probabilities"] == 1.0 and "judge_audit_tokens" not in metrics
    assert len(fake.requests) == 12, "the audit is read from the pairs' two orders: no second judgement"
    warning = audit_warning(metrics)
    assert warning is not None and "shown first wins 100%" in warning


async def test_a_judge_without_logprobs_is_read_from_json_and_says_so_once(fake, judge, caplog):
    fake.good_score = 0.3  # the JSON path's scores
    with caplog.at_level(logging.WARNING, logger="agentrl.judges.readout"):
        first = await ruler([attempt(0.1), attempt(0.9)], judge, readout="probabilities")
        again = await ruler([attempt(0.2), attempt(0.8)], judge, readout="probabilities")
    assert first.scores == again.scores == [0.3, 0.3] and not first.read_from_probabilities
    asked = [("logprobs" in r, "response_format" in r) for r in fake.requests]
    # The first group's two pair calls ask for logprobs (concurrently); then the judge is read from JSON only.
    assert asked == [(True, False), (True, False), (False, True), (False, True)]
    warnings = [r.getMessage() for r in caplog.records if "answered without logprobs" in r.getMessage()]
    assert len(warnings) == 1 and "read from sampled JSON" in warnings[0]
    group = agentrl.TrajectoryGroup(agentrl.Trajectory(reward=q, messages_and_choices=attempt(q)) for q in (0.1, 0.9))
    judged = await agentrl.ruler_score_group(group, judge, readout="probabilities", audit=None)
    assert judged.metrics["judge_read_from_probabilities"] == 0.0
    # Providers that take no logprobs are known before any call (litellm's own parameter check).
    assert not probabilities_supported("anthropic/claude-3-5-sonnet-20240620")
    assert not probabilities_supported("openai/o4-mini")
    assert probabilities_supported("openai/gpt-4o-mini") and probabilities_supported("hosted_vllm/judge")


async def test_debiasing_by_permutations_is_refused_where_every_pair_is_asked_both_ways(judge):
    group = agentrl.TrajectoryGroup(agentrl.Trajectory(reward=q, messages_and_choices=attempt(q)) for q in (0.1, 0.9))
    with pytest.raises(agentrl.ConfigurationError, match="already judged in both orders"):
        await agentrl.ruler_score_group(group, judge, readout="probabilities", permutations=3)
    with pytest.raises(agentrl.ConfigurationError, match="readout must be one of json, probabilities"):
        await ruler([attempt(0.1)], judge, readout="logits")  # type: ignore[arg-type]


async def test_settings_of_a_json_answer_are_refused_where_the_judge_is_trained_on_one_token(judge):
    """`orders` and `max_tokens` change nothing when the judge learns one token: refused before any call."""
    example = JudgeExample(message_lists=[attempt(0.1), attempt(0.9)], labels=[0.0, 1.0])
    model = agentrl.TrainableModel(name="j", project="p")  # unregistered: the refusal comes first
    with pytest.raises(agentrl.ConfigurationError, match="orders does not apply with readout='probabilities'"):
        await train_judge(model, [example], orders=3, readout="probabilities")
    with pytest.raises(agentrl.ConfigurationError, match="max_tokens does not apply .* use readout='json'"):
        await train_judge_rl(model, [example], max_tokens=64, readout="probabilities")


async def test_rubric_verdicts_are_read_as_the_probability_of_yes(fake, judge):
    fake.first_token_probabilities = lambda r: (
        {"Yes": 0.6, "No": 0.2, "The": 0.2}
        if "first rubric" in r["messages"][-1]["content"]
        else {"Yes": 0.1, "No": 0.3}
    )
    judgement = await judge_rubrics(
        "Task.", "Answer.", ["the first rubric", "the second rubric"], judge, readout="probabilities"
    )
    assert [v.probability for v in judgement.verdicts] == pytest.approx([0.75, 0.25])
    assert [v.passed for v in judgement.verdicts] == [True, False]
    assert judgement.pass_rate == pytest.approx(0.5)  # the expected share of rubrics passed
    assert len(fake.requests) == 2 and all(r["max_tokens"] == 1 for r in fake.requests)


def test_a_decision_demonstration_carries_loss_on_its_one_answer_token(tokenizer):
    example = JudgeExample(message_lists=[attempt(0.9), attempt(0.1), attempt(0.5)], labels=[1.0, 0.0, 0.5])
    assert ordered_pairs(example) == [(0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1)]

    def answer(letter: str) -> Choice:
        (token_id,) = tokenizer.encode(letter, add_special_tokens=False)
        token = {"token": f"token_id:{token_id}", "logprob": 0.0, "bytes": None, "top_logprobs": []}
        return Choice.model_validate(
            {
                "index": 0,
                "finish_reason": "length",
                "message": {"role": "assistant", "content": letter},
                "logprobs": {"content": [token]},
                "token_ids": [token_id],
            }
        )

    histories = decision_histories([example], {"A": answer("A"), "B": answer("B")})
    expected = ["A", "A", "B", "B", "B", "A"]  # the labels' order of each pair, the first shown as A
    for history, letter, (i, j) in zip(histories, expected, ordered_pairs(example)):
        assert shown_qualities({"messages": history.messages()[:-1]}) == (
            0.9 if i == 0 else 0.1 if i == 1 else 0.5,
            0.9 if j == 0 else 0.1 if j == 1 else 0.5,
        )
        sequence = tokenize_history(history, tokenizer, train_on_written_assistant=True)
        trained = [t for t, on in zip(sequence.input_ids_T, sequence.loss_mask_T) if on]
        assert trained == tokenizer.encode(letter, add_special_tokens=False), "the decision alone, no end of turn"
        assert sum(sequence.loss_mask_T) == 1
