"""A model's step on the local backend as a transaction. `grpo_step`: the groups get their sampled tokens and
are screened, the trainer updates the adapter, the step's metrics and token ledger are closed, and the
checkpoint is committed (`ModelSession.commit`); a step that trains nothing says why (`TrainResult.skip_reason`).
`updating`: the server asleep while the adapter changes where they share a device, and the adapter put back to
the served checkpoint on any failure, so a retry applies exactly one step."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from agentrl.backend.sampled_tokens import fill_sampled_tokens
from agentrl.backend.serving.replicas import ServerReplicas
from agentrl.backend.session import ModelSession
from agentrl.backend.training.adapter_trainer import StepOutcome
from agentrl.backend.training.step_input import StepInput
from agentrl.client.backend_protocol import TrainResult
from agentrl.data.trajectory_group import TrajectoryGroup
from agentrl.foundation.config import TrainConfig
from agentrl.foundation.errors import AgentRLError
from agentrl.gateway.store import SampledStore
from agentrl.rl.ledger import step_ledger
from agentrl.rl.screen import judge_failure_error, screen_groups, skip_reason
from agentrl.rl.tokenize import check_token_ids, labelled_histories

logger = logging.getLogger(__name__)


async def grpo_step(
    session: ModelSession,
    groups: list[TrajectoryGroup],
    config: TrainConfig,
    step_metrics: dict[str, float],
    *,
    dropped: list[TrajectoryGroup],
    store: SampledStore,
    vocab_size: int,
    update: Callable[[list[TrajectoryGroup], TrainConfig], Awaitable[StepOutcome]],
) -> TrainResult:
    """Train `session`'s model one step on `groups` (`update` runs the trainer on the trainable ones) and commit
    it; `step_metrics` (the caller's own, e.g. a pipeline's staleness) join the step's metrics, and the tokens of
    the groups the caller sampled and `dropped` are the ledger's stale row."""
    config = session.with_kl_reference(config)  # a step as the KL reference: its checkpoint folder
    groups = fill_sampled_tokens(groups, store)  # Choices that kept only their completion id
    dropped = fill_sampled_tokens(dropped, store)
    check_token_ids(labelled_histories(groups), vocab_size)  # before any of it reaches the trainer
    screened = screen_groups(groups)  # raises RewardError for a missing or non-finite reward
    if (error := judge_failure_error(screened, config.max_judge_failure_rate)) is not None:
        raise error
    if screened.num_judge_failed:
        logger.warning(
            "judge failures dropped %d of %d groups this step; last judge error: %s",
            screened.num_judge_failed,
            screened.num_given,
            screened.last_judge_error,
        )
    outcome = await update(screened.trainable, config) if screened.trainable else StepOutcome(updated=False)
    reason = None
    if not outcome.updated:
        counts = outcome.counts
        reason = skip_reason(
            screened,
            num_zero_variance=counts.zero_variance_groups,
            num_skipped_trajectories=counts.skipped_trajectories,
        )
        name, step = session.model.name, session.step
        logger.warning("%s: step %d skipped, the step counter stays at %d: %s", name, step + 1, step, reason)
    metrics = {**step_metrics, **outcome.metrics, **screened.metrics()}
    if (inexact := metrics.get("sampled_turns", 0) - metrics.get("context_exact_turns", 0)) > 0:
        logger.warning(
            "%s step %d: %d of %d trained turns carry no engine prompt ids (built by hand, or no longer in the "
            "gateway's store) and were scored in the re-rendered conversation; TrainConfig(require_exact_context=True) "
            "refuses them",
            session.model.name,
            session.step + 1,
            inexact,
            metrics["sampled_turns"],
        )
    metrics.update(step_ledger(groups, dropped, outcome.counts, store.rollout_tokens))
    trained_on = StepInput(screened.trainable, config, outcome.conditions) if outcome.conditions is not None else None
    result = await session.commit(
        StepOutcome(outcome.updated, metrics), split="train", groups=list(groups), step_input=trained_on
    )
    return dataclasses.replace(result, skip_reason=reason, last_judge_error=screened.last_judge_error)


@contextlib.asynccontextmanager
async def updating(
    session: ModelSession, asleep: ServerReplicas | None, next_move: Callable[[], str]
) -> AsyncIterator[None]:
    """The trainer changes `session`'s adapter with `asleep` (the server on its device, where they share one)
    asleep. If the update or the wake-up after it fails, the adapter and optimizer go back to the served
    checkpoint before the error is raised, which then says what to do next (`next_move`)."""
    try:
        if asleep is not None:
            await asleep.sleep()
        yield
        if asleep is not None:
            await asleep.wake_up()
    except Exception as error:
        await session.roll_back(session.step, f"the update failed before it was saved ({error})")
        if asleep is not None:
            with contextlib.suppress(Exception):  # best effort: the error below says what went wrong
                await asleep.wake_up()
        if isinstance(error, AgentRLError):
            raise type(error)(f"{error}. Nothing of this step was applied: {next_move()}") from error
        raise
