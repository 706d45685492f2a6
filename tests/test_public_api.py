"""The public surface is deliberate: this list changes only on purpose."""

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
    "judge_rubrics",
    "load_rubric_tasks",
    "rubric_rollout",
    "ruler",
    "ruler_score_group",
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


def test_import_agentrl_does_not_load_litellm_until_a_judge_is_used():
    import subprocess
    import sys

    code = "import sys, agentrl; assert 'litellm' not in sys.modules; agentrl.ruler_score_group; assert 'litellm' in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
