"""2048: a multi-turn game environment (engine, rollout, reward, evaluation, training entry point)."""
