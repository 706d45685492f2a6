"""Regenerate the tables of docs/coming-from-art.md that the code defines: what each of ART's training keys becomes
(`agentrl.art.training`), and how `agentrl.art` steps the optimizer. Usage: python scripts/coming_from_art.py"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agentrl.art import training  # noqa: E402
from benchmarks.readme import replace_section  # noqa: E402

KEYS_START, KEYS_END = "<!-- training-keys:start -->", "<!-- training-keys:end -->"
OPTIMIZER_START, OPTIMIZER_END = "<!-- art-optimizer:start -->", "<!-- art-optimizer:end -->"


def keys_table() -> str:
    """Every training key ART's `backend.train` (0.5.18 to 0.5.23) takes, and what agentrl does with it."""
    rows = ["| ART training key | ART's default | in `agentrl.TrainConfig` |", "| --- | --- | --- |"]
    for key, (default, becomes) in training.MAPPED.items():
        rows.append(f"| `{key}` | `{default!r}` | {becomes} |")
    for key in training.COMPUTE_ONLY:
        rows.append(f"| `{key}` | | accepted: changes how ART computes, not what it learns |")
    for key in training.MEGATRON_ONLY:
        rows.append(f"| `{key}` | | accepted: ART's LocalBackend applies it nowhere (Megatron's optimizer only) |")
    for key, default in training.INERT.items():
        rows.append(
            f"| `{key}` | `{default!r}` | accepted with a warning: ART 0.5.18's LocalBackend applies it nowhere |"
        )
    for key, (accepted, instead) in training.UNSUPPORTED.items():
        values = ", ".join(f"`{v!r}`" for v in accepted)
        rows.append(f"| `{key}` | `{accepted[0]!r}` | only {values}; else `ConfigurationError`: {instead} |")
    return "\n".join(rows)


def optimizer_table() -> str:
    """The `agentrl.TrainConfig` settings every `agentrl.art` training call gets."""
    rows = ["| setting | `agentrl.art` (as ART's LocalBackend) | agentrl's own default |", "| --- | --- | --- |"]
    from agentrl import TrainConfig

    for field, value in training.ART_OPTIMIZER.items():
        rows.append(f"| `{field}` | `{value!r}` | `{TrainConfig.model_fields[field].default!r}` |")
    return "\n".join(rows)


def main() -> None:
    replace_section(KEYS_START, KEYS_END, f"{KEYS_START}\n{keys_table()}\n{KEYS_END}")
    replace_section(OPTIMIZER_START, OPTIMIZER_END, f"{OPTIMIZER_START}\n{optimizer_table()}\n{OPTIMIZER_END}")


if __name__ == "__main__":
    main()
