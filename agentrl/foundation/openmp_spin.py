"""How long an idle OpenMP thread spins before it sleeps: libgomp's default, bounded only for pipelined CPU runs.

On a CPU the vLLM server and the trainer share the cores, each with a thread per core, and torch's libgomp
threads spin at every barrier before they sleep (300,000 turns by default). In the synchronous loop the two
never compute at once, and the spin makes each faster: on a 2-core Intel Xeon with AMX (bf16, 2026-12-02)
the main job took 2 min 34 s and 2 min 42 s against 2 min 57 s and 3 min 1 s with the spin bounded at 2,000
turns, and the rubric environment's training test 39 s against 57 s. Where they compute at once (a pipelined
run trains one step while the next samples), a thread waiting for a sibling the other process has descheduled
burns the core that sibling needs: the pipelined learning test took 181 s unbounded against 64 s bounded
(same machine and day; 24-42 s against 4-5 s a training micro-batch on a bf16 EPYC, 2026-11-29).

libgomp reads GOMP_SPINCOUNT once, when torch loads it, so the bound must be chosen before then, in the
trainer's process; the servers started later inherit it. `agentrl train --max-steps-off-policy` sets it
(`bound_openmp_spinning`), as does `agentrl backend serve --pipelined` for a service's clients; a script of
one's own sets GOMP_SPINCOUNT=2000 before it imports torch. `train_pipelined` warns when the backend says a
run lacks it (`agentrl.client.model.ReportsSpinning`: a LocalBackend from this process, a RemoteBackend from the
service's, reported at register). A LocalBackend that lacks it (torch was loaded first: a notebook, ART's
`PipelineTrainer`) computes its trainer on one thread while the run lasts, which takes most of the loss back:
the pipelined learning test in-process took 73 s so, against 168 s on two threads and 58 s bounded (2-core
Intel Xeon with AMX, bf16, 2026-12-02; 60 s bounded on one thread).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping

logger = logging.getLogger(__name__)

SPIN_VARIABLE = "GOMP_SPINCOUNT"
BOUNDED_SPIN_TURNS = 2000
"""The bound for processes that compute beside each other on shared cores (agentrl train's pipelined runs)."""
MOST_TURNS_THAT_SHARE_CORES = 20_000
"""Spins up to this many turns count as bounded: `benchmarks.sampling` ran as fast at 2,000 and 20,000 (bf16
EPYC), though a pipelined run was measured only at 2,000; libgomp's default is 300,000."""


def bound_openmp_spinning() -> bool:
    """Bound the spin (GOMP_SPINCOUNT=2000) in this process and every process it starts, for a run whose
    server and trainer compute at once. Only before torch loads (libgomp has read the variable by then) and
    where the user has not chosen; says whether it applied."""
    if SPIN_VARIABLE in os.environ or "torch" in sys.modules:
        return False
    os.environ[SPIN_VARIABLE] = str(BOUNDED_SPIN_TURNS)
    return True


def with_spin_bounded(env: Mapping[str, str]) -> dict[str, str]:
    """`env` for a child process whose server and trainer will compute at once: the bound added, unless `env`
    sets one (the child's libgomp reads it when torch loads there)."""
    return {SPIN_VARIABLE: str(BOUNDED_SPIN_TURNS), **env}


def spin_is_bounded() -> bool:
    """Whether this process's environment bounds OpenMP's spin enough to share the cores with another process
    (GOMP_SPINCOUNT at most 20,000, or OMP_WAIT_POLICY=passive, which does not spin)."""
    if os.environ.get("OMP_WAIT_POLICY", "").strip().lower() == "passive":
        return True
    turns = os.environ.get(SPIN_VARIABLE, "").strip().lower()
    if turns == "infinity" or not turns:
        return False
    try:
        return int(turns) <= MOST_TURNS_THAT_SHARE_CORES
    except ValueError:  # libgomp ignores what it cannot read, and spins its default
        return False


def spin_fix_beside(server_on_cpu: bool) -> str | None:
    """What would stop this process's trainer and its server stealing each other's cores while both compute,
    or None where nothing needs to change (the server on a GPU, or the spin already bounded)."""
    if not server_on_cpu or spin_is_bounded():
        return None
    now = os.environ.get(SPIN_VARIABLE)
    return (
        f"{SPIN_VARIABLE} is {'unset (libgomp spins 300000 turns)' if now is None else repr(now)} in this process; "
        f"set {SPIN_VARIABLE}={BOUNDED_SPIN_TURNS} in the environment before torch is imported (or run "
        "`agentrl train --max-steps-off-policy N`, which does)"
    )


def warn_spinning_beside_the_server(fix: str, *, trainer_on_one_thread: bool) -> None:
    """Warn that a pipelined run's trainer and CPU server spin on each other's cores, naming `fix`, and say
    whether the trainer computes on one thread meanwhile (LocalBackend's `pipelined_cores`)."""
    if trainer_on_one_thread:
        logger.warning(
            "pipelined training with the server on the trainer's CPU and OpenMP's idle spin unbounded: the trainer "
            "computes on one thread for this run, so that the two do not steal each other's cores (about 3x slower "
            "otherwise). Faster still: %s.",
            fix,
        )
        return
    logger.warning(
        "pipelined training with the server on the trainer's CPU: the two compute at once on the same cores, "
        "and OpenMP's idle spin makes each steal the cores the other needs (about 3x slower). Fix: %s. Or use the "
        "synchronous loop, faster on one CPU.",
        fix,
    )
