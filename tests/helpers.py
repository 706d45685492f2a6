"""Builders for test data that mirror what vLLM returns."""

import random
from typing import Any

from openai.types.chat.chat_completion import Choice

import agentrl

WORDS = "the quick brown fox jumps over a lazy dog while seven cats watch from the old stone wall".split()


def make_choice(
    token_ids: list[int],
    logprobs: list[float] | None = None,
    *,
    content: str | None = "",
    tool_calls: list[dict[str, Any]] | None = None,
    ids_as_tokens: bool = False,
) -> Choice:
    """A Choice as vLLM returns it: ids in `token_ids` (return_token_ids) or spelled `token_id:N`."""
    logprobs = logprobs if logprobs is not None else [-0.5] * len(token_ids)
    entries = [
        {"token": f"token_id:{t}" if ids_as_tokens else f"t{t}", "logprob": lp, "bytes": None, "top_logprobs": []}
        for t, lp in zip(token_ids, logprobs)
    ]
    data: dict[str, Any] = {
        "index": 0,
        "finish_reason": "tool_calls" if tool_calls else "stop",
        "message": {"role": "assistant", "content": content, "tool_calls": tool_calls},
        "logprobs": {"content": entries},
    }
    if not ids_as_tokens:
        data["token_ids"] = token_ids
    return Choice.model_validate(data)


def synthetic_groups(
    tokenizer: Any, *, seed: int, size: int = 4, num_groups: int | None = None, max_words: int = 30
) -> list[agentrl.TrajectoryGroup]:
    """Groups of sampled answers (real token ids, random words, 3 to `max_words` long) with random
    rewards and made-up sampler logprobs: training input without a server."""
    rng = random.Random(seed)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    groups = []
    for g in range(size if num_groups is None else num_groups):
        trajectories = []
        for _ in range(size):
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, max_words)))
            ids = tokenizer.encode(text, add_special_tokens=False) + [end]
            logprobs = [-rng.uniform(0.5, 4.0) for _ in ids]
            trajectories.append(
                agentrl.Trajectory(
                    messages_and_choices=[
                        {"role": "user", "content": f"Say something about animal number {g}."},
                        make_choice(ids, logprobs, content=tokenizer.decode(ids[:-1])),
                    ],
                    reward=rng.random(),
                )
            )
        groups.append(agentrl.TrajectoryGroup(trajectories))
    return groups


async def assert_trains_on_exact_tokens(model: agentrl.TrainableModel, trajectories: list[agentrl.Trajectory]) -> None:
    """The trajectories' trained tokens are exactly the ones the server sampled, and they train a step."""
    from agentrl.gateway.store import fill_sampled_tokens
    from agentrl.rl.tokenize import tokenize_history

    backend = model._backend
    (group,) = fill_sampled_tokens([agentrl.TrajectoryGroup(trajectories)], backend.gateway.store)
    for trajectory in group.trajectories:
        sequence = tokenize_history(trajectory, backend.trainer.tokenizer)
        sampled = [token for choice in trajectory.choices() for token in choice.model_extra["token_ids"]]
        assert sampled and [t for t, m in zip(sequence.input_ids_T, sequence.loss_mask_T) if m] == sampled
    step = await model.get_step()
    result = await model.train([agentrl.TrajectoryGroup(trajectories)], agentrl.TrainConfig(learning_rate=1e-5))
    assert not result.skipped and result.step == step + 1
