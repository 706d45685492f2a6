"""ART 0.5.20+'s metric catalogue (`art.MetricDefinition`, `art.PIPELINE_RL_*`), filled with the metrics agentrl's
pipelined loop records: the keys are agentrl's, as W&B and `metrics.jsonl` receive them ({split}/{name}), not ART's
`objective/...`/`throughput/...` keys, which agentrl does not compute."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


class MetricDefinition(BaseModel):
    """One metric: its key, what to call it, what it measures, and whether a dashboard shows it by default."""

    key: str
    title: str
    description: str
    kind: Literal["counter", "duration", "gauge", "rate", "ratio", "score"]
    unit: str | None = None
    higher_is_better: bool | None = None
    dashboard_default: bool = False
    score_component: bool = False


PIPELINE_RL_METRIC_DEFINITIONS: tuple[MetricDefinition, ...] = (
    MetricDefinition(key="train/reward_mean", title="Reward", description="Mean reward of the step's trajectories.",
                     kind="score", higher_is_better=True, dashboard_default=True, score_component=True),
    MetricDefinition(key="val/reward_mean", title="Validation reward", description="Mean reward on held-out scenarios.",
                     kind="score", higher_is_better=True, dashboard_default=True),
    MetricDefinition(key="train/staleness_mean", title="Staleness", description="Steps between a group's oldest "
                     "turn and the step it trained, averaged.", kind="gauge", unit="steps", higher_is_better=False,
                     dashboard_default=True),
    MetricDefinition(key="train/num_groups_stale_dropped", title="Stale groups dropped", description="Groups "
                     "staler than max_steps_off_policy, never trained.", kind="counter", higher_is_better=False),
    MetricDefinition(key="train/trainer_idle_frac", title="Trainer idle", description="Share of the step cycle the "
                     "trainer waited for groups.", kind="ratio", higher_is_better=False, dashboard_default=True),
    MetricDefinition(key="train/sampler_idle_frac", title="Sampler idle", description="Share of the step cycle no "
                     "rollout ran.", kind="ratio", higher_is_better=False, dashboard_default=True),
    MetricDefinition(key="train/steps_per_hour", title="Steps per hour", description="Training steps per hour of "
                     "wall time.", kind="rate", unit="steps/h", higher_is_better=True, dashboard_default=True),
)  # fmt: skip
"""The pipelined loop's metrics, by the keys agentrl records them under."""
PIPELINE_RL_DASHBOARD_DEFAULT_METRICS = tuple(d.key for d in PIPELINE_RL_METRIC_DEFINITIONS if d.dashboard_default)
PIPELINE_RL_SCORE_METRICS = tuple(d.key for d in PIPELINE_RL_METRIC_DEFINITIONS if d.score_component)
