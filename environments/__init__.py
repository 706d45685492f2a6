"""Environments built on agentrl's public API: each has its world, rollout, reward, evaluation and training entry point."""
