"""Which of two numbers is larger? The small verifiable task of the main job (README)."""
