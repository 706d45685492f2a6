"""Rewrite one marked section of README.md (atomically): where each benchmark records its table."""

from __future__ import annotations

from pathlib import Path

from agentrl.files import write_text_atomic

README = Path(__file__).resolve().parent.parent / "README.md"


def replace_section(start: str, end: str, body: str) -> None:
    """Replace everything from the `start` marker to the `end` marker (inclusive) with `body`."""
    text = README.read_text()
    if start not in text or end not in text:
        raise SystemExit(f"README.md lacks the markers {start} ... {end}")
    before, rest = text.split(start, 1)
    write_text_atomic(README, before + body + rest.split(end, 1)[1])
