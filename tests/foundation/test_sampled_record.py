"""The sampled-completion record: typed fields read from a Choice or its JSON, written back as stamps; the
served name made and read in one place; no stamp key spelled as a string anywhere else in the library."""

import re
from pathlib import Path

import pytest
from openai.types.chat.chat_completion import Choice

import agentrl
from agentrl.client.pipeline import oldest_policy_step
from agentrl.foundation.errors import TokenizationError
from agentrl.foundation.sampled_record import SampledRecord, served_by, served_name, served_step
from agentrl.rl.tokenize import choice_token_ids
from tests.helpers import make_choice

LIBRARY = Path(agentrl.__file__).parent


def test_a_record_reads_a_choice_or_its_json_and_writes_the_same_stamps_back():
    record = SampledRecord(completion_id="chatcmpl-1", policy_step=3, token_ids=[5, 6], prompt_token_ids=[1, 2])
    as_json = {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hi"}}
    choice = Choice.model_validate({**as_json, **record.stamps()})
    assert SampledRecord.of(choice) == record == SampledRecord.of({**as_json, **record.stamps()})
    assert record.from_gateway and not SampledRecord(completion_id="x").from_gateway
    assert SampledRecord.naming(choice).stamps() == {"completion_id": "chatcmpl-1", "policy_step": 3}
    assert SampledRecord.of(Choice.model_validate(as_json)) == SampledRecord()
    # A step that is not a whole number is no step; ids that are not whole numbers are an error naming the field.
    assert SampledRecord.of({"policy_step": "3"}).policy_step is None
    with pytest.raises(TokenizationError, match="prompt_token_ids must be a list of whole numbers"):
        SampledRecord.of({"prompt_token_ids": [1, "2"]})


def test_served_names_are_made_and_read_by_one_pair_of_functions():
    assert served_name("agent", 12) == "agent@12" and served_step("agent@12") == 12
    assert [served_step(n) for n in ("a@b@3", "base", "agent@", "@4", "agent@1x", "agent@٣", None)] == [
        3,
        None,
        None,
        None,
        None,
        None,
        None,
    ]
    assert served_by("a@b@3", "a@b") and not served_by("agent@3", "age") and not served_by("agent", "agent")


def test_token_ids_come_from_the_record_else_only_from_logprob_tokens_vllm_spells_as_ids():
    assert choice_token_ids(make_choice([7, 8])) == [7, 8]
    assert choice_token_ids(make_choice([7, 8], ids_as_tokens=True)) == [7, 8]
    text_tokens = make_choice([7, 8]).model_dump()
    text_tokens.pop("token_ids")
    text_tokens["logprobs"]["content"][0]["token"] = "12"  # a token whose text is a number is not an id
    assert choice_token_ids(Choice.model_validate(text_tokens)) is None


def test_a_trajectorys_policy_steps_are_read_once_for_the_pipeline_and_art_versions():
    stamped = SampledRecord(completion_id="c", policy_step=7).stamps()
    turn = {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}
    trajectory = agentrl.Trajectory(
        messages_and_choices=[
            {"role": "user", "content": "q"},
            Choice.model_validate({**turn, **stamped}),
            {"role": "user", "content": "again"},
            Choice.model_validate(turn),
        ]
    )
    assert trajectory.policy_steps() == [7, None]
    assert trajectory.initial_policy_version == trajectory.final_policy_version == 7
    assert oldest_policy_step(agentrl.TrajectoryGroup([trajectory]), started_at=5) == 5
    assert oldest_policy_step(agentrl.TrajectoryGroup([trajectory]), started_at=9) == 7


def test_no_module_but_the_records_own_spells_a_stamp_key_or_parses_a_served_name():
    # vLLM's own response fields are read where its answers are parsed (gateway/store.py), and its spelling of
    # ids as logprob tokens where a Choice from a bare vLLM endpoint is read (rl/tokenize.py); nowhere else.
    stamp_key = re.compile(r"""["'](completion_id|policy_step|token_ids|prompt_token_ids)["']|token_id:\{|@\(\\d""")
    allowed = {"foundation/sampled_record.py", "gateway/store.py"}
    spelled = [
        f"{path.relative_to(LIBRARY)}:{number}"
        for path in LIBRARY.rglob("*.py")
        if str(path.relative_to(LIBRARY)) not in allowed
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if stamp_key.search(line) and "path_params" not in line  # the store's route names its parameter
    ]
    assert spelled == []
