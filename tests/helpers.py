"""Builders for test data that mirror what vLLM returns."""

from typing import Any

from openai.types.chat.chat_completion import Choice


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
