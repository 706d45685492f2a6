"""ART's `art.rewards`: RULER, agentrl's implementation under ART's names and keywords."""

from agentrl.judges import ruler, ruler_score_group

__all__ = ["ruler", "ruler_score_group"]
