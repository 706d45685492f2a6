"""How long an idle OpenMP thread spins before it sleeps, bounded in agentrl's processes and the servers they start.

On a CPU the vLLM server and the trainer share the cores, each with a thread per core. torch's libgomp
threads spin at every barrier before they sleep (300,000 turns by default), so while both compute (a
pipelined run trains one step while the next samples) a thread that waits for a sibling the other
process has descheduled burns the core that sibling needs: one training micro-batch took 24-42 s beside
the sampling server, and 4-5 s with the spin bounded at 2,000 turns (bf16 EPYC).

Where they never compute at once (a synchronous loop: the server waits while the trainer steps) the bound
only makes each of them slower: the main job (`agentrl train larger-number`) took 2 min 57 s and 3 min 1 s
with it and 2 min 34 s and 2 min 42 s with libgomp's own spin (bf16 Intel Xeon with AMX, 2026-12-02, runs
alternated; a training step's median 2.75-3.0 s against 2.15 s). So `agentrl train` without pipelining
lifts the bound (`spin_freely`); a script of one's own does the same by setting GOMP_SPINCOUNT=300000
before it imports agentrl.
"""

from __future__ import annotations

import os
import sys

SPIN_VARIABLE = "GOMP_SPINCOUNT"
SPIN_TURNS = "2000"
_bounded_here = False
"""Whether `bound_openmp_spinning` set the variable (a user's own setting is never changed)."""


def bound_openmp_spinning() -> None:
    """Set GOMP_SPINCOUNT (unless the user has) for this process and every process it starts.

    libgomp reads it once, when torch first loads it: `import agentrl` calls this before anything imports
    torch, and a script that imported torch first keeps libgomp's default in its own process (the trainer's);
    the servers it starts still get the bound."""
    global _bounded_here
    if SPIN_VARIABLE not in os.environ:
        os.environ[SPIN_VARIABLE] = SPIN_TURNS
        _bounded_here = True


def spin_freely() -> bool:
    """For a run whose server and trainer never compute at once (the synchronous loop): libgomp's own spin,
    in this process and the servers it starts. Only where agentrl set the bound and torch has not loaded
    yet (libgomp would keep the bound in this process); says whether it applied."""
    global _bounded_here
    if not _bounded_here or "torch" in sys.modules:
        return False
    del os.environ[SPIN_VARIABLE]
    _bounded_here = False
    return True
