"""Adapters on the frozen base: each model's LoRA, optimizer and checkpoint files."""
