"""Rollout helpers: iterate_dataset (epochs, batches, resuming), retry and limit_concurrency."""

from __future__ import annotations

import asyncio

import pytest

import agentrl


def test_iterate_dataset_covers_each_epoch_once_in_a_fixed_order_and_resumes_where_it_stopped():
    dataset = list(range(10))
    batches = list(agentrl.iterate_dataset(dataset, batch_size=4, epochs=2, seed=7, show_progress=False))
    assert [(b.step, b.epoch, b.epoch_step, len(b.items)) for b in batches] == [
        (0, 0, 0, 4), (1, 0, 1, 4), (2, 0, 2, 2), (3, 1, 0, 4), (4, 1, 1, 4), (5, 1, 2, 2)]  # fmt: skip
    for epoch in (0, 1):
        assert sorted(i for b in batches if b.epoch == epoch for i in b.items) == dataset
    assert [i for b in batches for i in b.items][:10] != [i for b in batches for i in b.items][10:]  # reshuffled
    resumed = list(
        agentrl.iterate_dataset(dataset, batch_size=4, epochs=2, seed=7, initial_step=4, show_progress=False)
    )
    assert resumed == batches[4:]  # a resumed run gets exactly the steps it has not trained on
    in_order = list(agentrl.iterate_dataset(dataset, batch_size=5, shuffle=False, show_progress=False))
    assert [b.items for b in in_order] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    with pytest.raises(agentrl.ConfigurationError, match="batch_size >= 1"):
        next(agentrl.iterate_dataset(dataset, batch_size=0))
    with pytest.raises(agentrl.ConfigurationError, match="empty dataset"):
        next(agentrl.iterate_dataset([]))


async def test_retry_calls_again_on_the_named_errors_only():
    calls = []

    @agentrl.retry(max_attempts=3, exceptions=(TimeoutError,), min_wait_s=0.01, max_wait_s=0.01)
    async def flaky(fail_times: int, error: type[Exception] = TimeoutError) -> str:
        calls.append(1)
        if len(calls) <= fail_times:
            raise error("not yet")
        return "done"

    assert await flaky(2) == "done" and len(calls) == 3
    calls.clear()
    with pytest.raises(TimeoutError):
        await flaky(5)
    assert len(calls) == 3  # gave up after max_attempts, with the last error as it was
    calls.clear()
    with pytest.raises(ValueError):
        await flaky(1, ValueError)
    assert len(calls) == 1  # other errors are not retried


async def test_limit_concurrency_lets_only_so_many_calls_run_at_once():
    running, peak = 0, 0

    @agentrl.limit_concurrency(2)
    async def tool(index: int) -> int:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.01)
        running -= 1
        return index

    assert await asyncio.gather(*(tool(i) for i in range(7))) == list(range(7))
    assert peak == 2
