"""ART's `art.local.LocalBackend`: agentrl's LocalBackend with ART's `path` and ART 0.5's `backend.train`."""

from __future__ import annotations

from typing import Any

import agentrl
from agentrl.art import TrainConfig, with_dev_config
from agentrl.trajectory import TrajectoryGroup


class LocalBackend(agentrl.LocalBackend):
    """`path`: where models registered with it keep their runs (ART's default ".art"); `in_process` is
    accepted and ignored (agentrl's trainer always runs in this process, its server in its own)."""

    def __init__(self, *, in_process: bool = False, path: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.art_path = path

    async def train(  # type: ignore[override]
        self,
        model: agentrl.TrainableModel,
        trajectory_groups: list[TrajectoryGroup],
        config: agentrl.TrainConfig | None = None,
        *,
        step_metrics: dict[str, float] | None = None,
        learning_rate: float | None = None,
        beta: float | None = None,
        **dev_config: Any,
    ) -> agentrl.TrainResult:
        """agentrl's `train(model, groups, config)`, or ART 0.5's `backend.train(model, groups,
        learning_rate=..., beta=..., <art.dev.TrainConfig keys>)`, which also moves the model's step on."""
        if config is not None:
            return await super().train(model, list(trajectory_groups), config, step_metrics=step_metrics)
        keywords = {"learning_rate": learning_rate, "beta": beta}
        art_config = TrainConfig(**{k: v for k, v in keywords.items() if v is not None})
        return await agentrl.TrainableModel.train(
            model, list(trajectory_groups), with_dev_config(art_config, dev_config)
        )
