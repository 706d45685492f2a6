"""Rewrite one marked section of README.md or a docs page (atomically): where each benchmark records its table."""

from __future__ import annotations

from pathlib import Path

from agentrl.foundation.files import write_text_atomic

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = (README, *sorted((ROOT / "docs").glob("*.md")))
"""Where marked sections live: the front page and the documentation site's pages."""


def replace_section(start: str, end: str, body: str) -> None:
    """Replace everything from the `start` marker to the `end` marker (inclusive) with `body`, in the page that
    holds the markers."""
    for page in PAGES:
        text = page.read_text()
        if start in text and end in text:
            before, rest = text.split(start, 1)
            write_text_atomic(page, before + body + rest.split(end, 1)[1])
            return
    raise SystemExit(f"no page holds the markers {start} ... {end} (README.md, docs/*.md)")
