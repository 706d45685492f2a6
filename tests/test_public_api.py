"""The public surface is deliberate: this list changes only on purpose."""

import pytest

import agentrl

EXPECTED = {
    "AgentRLError",
    "Backend",
    "BackendBrokenError",
    "GatewayLimits",
    "NotAllowedError",
    "StepConflictError",
    "CISPOLoss",
    "CheckpointError",
    "ConfigurationError",
    "DROLoss",
    "ExceptionBudget",
    "GSPOLoss",
    "History",
    "ImportanceSamplingLoss",
    "JudgeError",
    "LoRAConfig",
    "LocalBackend",
    "RemoteBackend",
    "Model",
    "ModelNotFoundError",
    "PPOLoss",
    "RewardError",
    "RolloutError",
    "RolloutException",
    "RunLockedError",
    "SessionOverflowError",
    "ServerConfig",
    "ServerError",
    "SFTConfig",
    "TokenizationError",
    "TrainConfig",
    "TrainResult",
    "TrainableModel",
    "TrainingError",
    "Trajectory",
    "TrajectoryGroup",
    "capture_trajectory",
    "current_trajectory",
    "no_capture",
    "DatasetBatch",
    "iterate_dataset",
    "limit_concurrency",
    "retry",
    "gather_trajectories",
    "gather_trajectory_groups",
    "train_pipelined",
    "disable_weave",
    "enable_weave",
    "traced",
    "JudgeCheckReport",
    "JudgeLimiter",
    "RubricTask",
    "JudgeAudit",
    "JudgeExample",
    "check_judge",
    "train_judge",
    "train_judge_rl",
    "train_verdict_judge",
    "VerdictExample",
    "judge_rubrics",
    "load_rubric_tasks",
    "rubric_rollout",
    "ruler",
    "ruler_score_group",
    "DEFAULT_BASE_PATH",
    "RunFolder",
    "EnvironmentCommands",
    "AfterEach",
    "JudgeModel",
    "JoinPoint",
    "handle_stop_signals",
}


def test_all_is_exactly_the_public_api():
    assert set(agentrl.__all__) == EXPECTED
    for name in agentrl.__all__:
        assert getattr(agentrl, name).__doc__, f"{name} needs a docstring"


def test_errors_share_one_root():
    for name in agentrl.__all__:
        obj = getattr(agentrl, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, agentrl.AgentRLError)


def test_train_config_accepts_a_loss_by_name_and_rejects_unknown_ones():
    assert agentrl.TrainConfig(loss="cispo").loss == agentrl.CISPOLoss()
    assert agentrl.TrainConfig(loss={"name": "gspo", "clip_high": 1e-3}).loss.clip_high == 1e-3
    import pytest
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="unknown loss 'grpo'"):
        agentrl.TrainConfig(loss="grpo")


def test_inference_name_is_name_at_step():
    model = agentrl.TrainableModel(name="agent-001", project="p")
    assert model.inference_name == "agent-001@0"
    assert str(model.run_dir).endswith("p/agent-001")


def test_agentrl_does_not_load_litellm_until_a_judge_is_called():
    import subprocess
    import sys

    # litellm takes ~2 s to import: the child refuses it and records who asked, rather than loading it.
    # A training step imports agentrl.judges (its audit), so the whole judges package must not load it either.
    code = """
import asyncio, importlib.abc, sys
asked = []
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "litellm":
            asked.append(name)
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Refuse())
import agentrl
import agentrl.judges, agentrl.judges.audit, agentrl.records.tracking, agentrl.art
assert not asked, asked
group = agentrl.TrajectoryGroup(
    [agentrl.Trajectory(messages_and_choices=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": a}])
     for a in ("hello", "hey")]
)
try:
    asyncio.run(agentrl.ruler_score_group(group, "openai/judge"))
except ModuleNotFoundError:
    pass
assert asked, "calling a judge did not import litellm"
"""
    subprocess.run([sys.executable, "-c", code], check=True)


# Run before `import agentrl` in a child: the training backend's packages cannot be imported, as in `pip install agentrl`.
WITHOUT_THE_BACKEND = """
import importlib.abc, sys
class Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"torch", "transformers", "peft", "gguf", "vllm"}:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Missing())
"""


def test_the_client_imports_without_the_training_backend_and_a_backend_piece_names_its_extra():
    import subprocess
    import sys

    code = WITHOUT_THE_BACKEND + (
        "import agentrl, agentrl.art, agentrl.judges, agentrl.backend.remote.client, agentrl.client.capture, agentrl.cli\n"
        "assert not {'torch', 'transformers', 'peft', 'vllm'} & set(sys.modules), sorted(sys.modules)\n"
        "agentrl.RemoteBackend('http://127.0.0.1:9', token='t'); agentrl.TrainableModel(name='m', project='p')\n"
        "from agentrl.backend.extras import BackendNotInstalledError\n"
        "for use in (lambda: agentrl.LocalBackend, lambda: agentrl.art.LocalBackend):\n"
        "    try:\n"
        "        use()\n"
        "    except BackendNotInstalledError as error:\n"
        "        assert \"pip install 'agent-grpo[cpu]'\" in str(error) and \"'torch' is not installed\" in str(error), error\n"
        "    else:\n"
        "        raise AssertionError('LocalBackend loaded without torch')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_command_line_without_the_training_backend_names_the_extra_and_doctor_passes_as_a_client():
    import subprocess
    import sys

    run = (
        WITHOUT_THE_BACKEND + "import sys; from agentrl.cli import main; sys.argv = ['agentrl', *sys.argv[1:]]; main()"
    )
    served = subprocess.run([sys.executable, "-c", run, "backend", "serve"], capture_output=True, text=True)
    assert served.returncode == 1
    assert "pip install 'agent-grpo[cpu]'" in served.stderr and "Traceback" not in served.stderr
    doctor = subprocess.run([sys.executable, "-c", run, "doctor"], capture_output=True, text=True)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert "client install" in doctor.stdout


def test_import_agentrl_leaves_openmp_spinning_to_libgomp_and_servers_get_a_users_setting():
    """Where the server and the trainer take turns (the synchronous loop), libgomp's own spin is faster:
    `import agentrl` sets nothing, and a server it starts gets what the user set (agentrl.foundation.openmp_spin)."""
    import os
    import subprocess
    import sys

    code = """
import os, sys
import agentrl
assert "torch" not in sys.modules
from agentrl.backend.serving.server import server_env
from agentrl.foundation.config import ServerConfig
print(os.environ.get("GOMP_SPINCOUNT", "-"), server_env(ServerConfig(), gpu=False, api_key="k").get("GOMP_SPINCOUNT", "-"))
"""
    env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    unset = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert unset.stdout.split() == ["-", "-"]
    chosen = subprocess.run(
        [sys.executable, "-c", code], env={**env, "GOMP_SPINCOUNT": "50"}, capture_output=True, text=True, check=True
    )
    assert chosen.stdout.split() == ["50", "50"]


@pytest.mark.parametrize(
    "environment, bounded",
    [
        ({}, False),
        ({"GOMP_SPINCOUNT": "300000"}, False),
        ({"GOMP_SPINCOUNT": "infinity"}, False),
        ({"GOMP_SPINCOUNT": "lots"}, False),  # libgomp ignores it and spins its default
        ({"GOMP_SPINCOUNT": "2000"}, True),
        ({"GOMP_SPINCOUNT": "20000"}, True),
        ({"OMP_WAIT_POLICY": "PASSIVE"}, True),
    ],
)
def test_a_pipelined_run_on_the_cpu_is_warned_when_openmp_would_spin_on_the_servers_cores(
    environment, bounded, monkeypatch, caplog
):
    from agentrl.foundation.openmp_spin import spin_fix_beside, warn_spinning_beside_the_server

    for name in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    fix = spin_fix_beside(server_on_cpu=True)
    assert (fix is None) is bounded
    if fix is not None:
        assert "GOMP_SPINCOUNT=2000" in fix and repr(environment.get("GOMP_SPINCOUNT", "unset"))[1:-1] in fix
        for on_one_thread in (False, True):
            caplog.clear()
            warn_spinning_beside_the_server(fix, trainer_on_one_thread=on_one_thread)
            assert "about 3x slower" in caplog.text and fix in caplog.text  # the warning names the fix
            assert ("computes on one thread for this run" in caplog.text) is on_one_thread
    assert spin_fix_beside(server_on_cpu=False) is None  # a GPU server: nothing shared


SPIN_SEEN_BY_A_RUN = """
import os, sys
import agentrl
import agentrl.cli.train as cli_train
from typer.testing import CliRunner
from agentrl.cli.app import app
from agentrl.foundation.plugins import EnvironmentCommands
if sys.argv[1] == "torch-first":  # else "agentrl-first"
    import torch
seen = []
async def run(*args, **kwargs):  # the environment's run: what its trainer (here) and its server would get
    from agentrl.backend.serving.server import server_env
    from agentrl.foundation.config import ServerConfig
    server = server_env(ServerConfig(), gpu=False, api_key="k")
    seen.extend([os.environ.get("GOMP_SPINCOUNT", "-"), server.get("GOMP_SPINCOUNT", "-")])
cli_train.load_environment = lambda name: EnvironmentCommands(run=run, evaluate_run=run, default_name="x")
result = CliRunner().invoke(app, ["train", "larger-number", *sys.argv[2:]])
assert result.exit_code == 0, result.output
print(*seen)
"""


@pytest.mark.parametrize(
    "user_setting, imported_first, args, expected",
    [
        (None, "agentrl-first", [], ["-", "-"]),  # synchronous: libgomp's own spin for the trainer here and its server
        (None, "agentrl-first", ["--max-steps-off-policy", "0"], ["-", "-"]),  # 0 is the synchronous loop
        (None, "agentrl-first", ["--max-steps-off-policy", "1"], ["2000", "2000"]),  # pipelined: both compute at once
        ("50", "agentrl-first", ["--max-steps-off-policy", "1"], ["50", "50"]),  # the user's setting stays
        (None, "torch-first", ["--max-steps-off-policy", "1"], ["-", "-"]),  # libgomp has read it: one setting
    ],
    ids=["synchronous", "zero-off-policy", "pipelined", "users-setting", "torch-already-loaded"],
)
def test_a_pipelined_agentrl_train_bounds_openmp_spinning_before_torch_loads_and_a_synchronous_one_does_not(
    user_setting, imported_first, args, expected
):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    if user_setting is not None:
        env["GOMP_SPINCOUNT"] = user_setting
    run = subprocess.run(
        [sys.executable, "-c", SPIN_SEEN_BY_A_RUN, imported_first, *args], env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.split() == expected


async def test_overlapping_pipelined_runs_keep_the_trainer_on_one_thread_until_the_last_one_ends():
    import torch

    from agentrl.backend.session import TrainerThread

    thread = TrainerThread()
    try:
        await thread.run(torch.set_num_threads, 3)
        async with thread.one_thread_while(False) as narrowed:
            assert narrowed is False and await thread.run(torch.get_num_threads) == 3
        first, second = thread.one_thread_while(True), thread.one_thread_while(True)
        assert await first.__aenter__() is True and await thread.run(torch.get_num_threads) == 1
        await second.__aenter__()  # a second model's pipelined run, begun meanwhile and ending last
        assert await thread.run(torch.get_num_threads) == 1
        await first.__aexit__(None, None, None)
        assert await thread.run(torch.get_num_threads) == 1  # the second run still trains on one
        await second.__aexit__(None, None, None)
        assert await thread.run(torch.get_num_threads) == 3  # as many as before, once the last ends
    finally:
        thread.shutdown()
