"""The GRPO math as pure functions: tokens, advantages, losses. No I/O, easy to test and read."""
