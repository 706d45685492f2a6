"""Which of two numbers is larger? The small verifiable task of README's main job."""
