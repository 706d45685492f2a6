"""Backends own a model's inference server, trainer and checkpoints. `LocalBackend` runs them on this machine."""
