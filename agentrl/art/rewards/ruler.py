"""ART's `art.rewards.ruler`: RULER with ART's signatures and return shapes, on agentrl's RULER.

ART's forms differ from agentrl's native ones on purpose: `ruler` returns a list of
`TrajectoryScore(trajectory_id, explanation, score)`, and `ruler_score_group(..., swallow_exceptions=True)`
returns None when the judge failed (agentrl's returns the group emptied, its error kept, so that
`model.train` can count judge failures)."""

from __future__ import annotations

import logging
from typing import Any

from pydantic import BaseModel

from agentrl.data.trajectory_group import TrajectoryGroup
from agentrl.foundation.errors import JudgeError
from agentrl.judges import ruler as agentrl_ruler
from agentrl.judges import ruler_score_group as agentrl_ruler_score_group
from agentrl.judges.ruler import DEFAULT_RUBRIC, EXPLANATION_LOG

logger = logging.getLogger(__name__)


class TrajectoryScore(BaseModel):
    """RULER's verdict on one trajectory (`trajectory_id` is "1", "2", ... in input order)."""

    trajectory_id: str
    explanation: str
    score: float


async def ruler(
    message_lists: list[list[dict[str, Any]]],
    judge_model: Any = "openai/o3",
    extra_litellm_params: dict[str, Any] | None = None,
    rubric: str = DEFAULT_RUBRIC,
    tools: list[dict[str, Any]] | None = None,
    *,
    debug: bool = False,
) -> list[TrajectoryScore]:
    """Score the message lists relative to each other in one judge call; none given, none scored (as ART)."""
    if not message_lists:
        return []
    result = await agentrl_ruler(
        message_lists, judge_model, rubric=rubric, tools=tools, extra_litellm_params=extra_litellm_params, debug=debug
    )
    return [
        TrajectoryScore(trajectory_id=str(i), explanation=explanation, score=score)
        for i, (score, explanation) in enumerate(zip(result.scores, result.explanations), start=1)
    ]


async def ruler_score_group(
    group: TrajectoryGroup,
    judge_model: Any = "openai/o3",
    extra_litellm_params: dict[str, Any] | None = None,
    rubric: str = DEFAULT_RUBRIC,
    *,
    swallow_exceptions: bool = False,
    debug: bool = False,
) -> TrajectoryGroup | None:
    """A copy of `group` whose rewards are RULER's scores (the old ones kept as `independent_reward`);
    with `swallow_exceptions=True`, None when the judge failed (drop the group, as ART's examples do)."""
    try:
        judged = await agentrl_ruler_score_group(
            group, judge_model, rubric=rubric, extra_litellm_params=extra_litellm_params, debug=debug
        )
    except JudgeError as error:
        if not swallow_exceptions:
            raise
        logger.warning("RULER failed for a group of %d; returning None: %s", len(group.trajectories), error)
        return None
    for trajectory in judged.trajectories:  # ART logs each verdict as "RULER explanation: ..."
        trajectory.logs = [
            f"RULER explanation: {line.removeprefix(EXPLANATION_LOG)}" if line.startswith(EXPLANATION_LOG) else line
            for line in trajectory.logs
        ]
    return judged
