"""How long an idle OpenMP thread spins before it sleeps, bounded in agentrl's processes and the servers they start.

On a CPU the vLLM server and the trainer share the cores, each with a thread per core. torch's libgomp
threads spin at every barrier before they sleep (300,000 turns by default), so while both compute (a
pipelined run trains one step while the next samples) a thread that waits for a sibling the other
process has descheduled burns the core that sibling needs: one training micro-batch took 24-42 s beside
the sampling server, and 4-5 s with the spin bounded at 2,000 turns (bf16 EPYC). Sampling alone ran as
fast either way (benchmarks.sampling).
"""

from __future__ import annotations

import os

SPIN_VARIABLE = "GOMP_SPINCOUNT"
SPIN_TURNS = "2000"


def bound_openmp_spinning() -> None:
    """Set GOMP_SPINCOUNT (unless the user has) for this process and every process it starts.

    libgomp reads it once, when torch first loads it: `import agentrl` calls this before anything imports
    torch, and a script that imported torch first keeps libgomp's default in its own process (the trainer's);
    the servers it starts still get the bound."""
    os.environ.setdefault(SPIN_VARIABLE, SPIN_TURNS)
