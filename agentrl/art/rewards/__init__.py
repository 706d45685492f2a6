"""ART's `art.rewards`: RULER under ART's names, keywords and return shapes."""

from .ruler import TrajectoryScore, ruler, ruler_score_group

__all__ = ["TrajectoryScore", "ruler", "ruler_score_group"]
