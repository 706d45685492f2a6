"""Instruction following with rubrics: a task that only an LLM judge rewards."""
