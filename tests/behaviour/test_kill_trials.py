"""Kill -9 at a random moment: a resumed run trains every scheduled scenario exactly once (issue 31).

Each suite run kills a synchronous and a pipelined run once, each at a moment drawn afresh (printed, with
what the record held), through `benchmarks.kill_trials` on the real server and trainer; the benchmark runs
more trials of the same. test_resume.py kills once at a chosen moment and checks the weights.
"""

import random

import pytest

from agentrl.backend.precision import cpu_has_native_bf16
from benchmarks.kill_trials import trial

SCENARIOS = 9  # three steps of 3 scenarios, groups of 4
KILL_WINDOW_S = (0.5, 4.0) if cpu_has_native_bf16() else (2.0, 12.0)
"""When the kill lands, seconds after the run started (its server up): within its first steps. Measured on a 2-core
float32 EPYC: kills 8.9 s in (step 1 saved, not yet reported) and 2.5 s in (step 1's groups in flight); each
mode's test, two starts of the run included, takes about 2 minutes there. On a bf16 EPYC a synchronous run had
trained all three steps 9.2 s in (2026-11-28); on 2026-11-29 one trained them 4.7 s in, and a kill drawn at
5.4 s missed. So the bf16 window is 0.5-4 s, and a draw past a run's end is drawn again within the time that run
took (`trial`), whatever the machine."""


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["synchronous", "pipelined", "at-commit"])
def test_a_run_killed_at_a_random_moment_trains_each_scenario_exactly_once(mode):
    seed = random.SystemRandom().randrange(2**32)
    # at-commit kills itself at its first trained step: two steps (one left to resume) show what it must.
    result = trial(mode, 6 if mode == "at-commit" else SCENARIOS, random.Random(seed), KILL_WINDOW_S)
    first, *later = result["attempts"]
    print(f"\n{mode}, seed {seed}: killed {first['killed_after_s']} s after it started, {len(later)} restarts")
    for miss in result["missed"]:
        print(f"  drawn {miss['kill_after_s']} s, after the run had finished ({miss['ran_s']} s): drawn again")
    for attempt in result["attempts"]:
        print(f"  {attempt['resumed']}: committed {attempt['steps_committed']}")
    # The kill landed while the run was working (the draw is within its first steps), and it was resumed.
    if mode == "at-commit":  # it killed itself after its first trained step's commit, before the step's records
        assert first["killed_itself"] == "KILLED AT COMMIT 1", result
    else:
        assert first["killed_after_s"] is not None, result
    assert first["trained"] is None, result
    assert later and later[-1]["trained"] is not None, result
    assert result["exactly_once"], result["attempts"][-1]["trained"]
    # Every committed step has its metrics line and trajectories, written again from its checkpoint if need be.
    assert result["records"]["steps"] and not result["records"]["missing"], result["records"]
    if mode == "at-commit":
        assert result["records"]["backfilled"] == [1], result["records"]
