"""Adapters for environments from other standards (OpenEnv, verifiers); each needs its own extra."""
