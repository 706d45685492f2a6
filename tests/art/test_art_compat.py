"""agentrl.art: code written the way ART documents it runs after changing its imports.

Fast tier: each ART name maps to agentrl's (keywords, defaults, semantics, clear errors). Real server:
an ART-style training script (register, gather, RULER with a local judge, train in both of ART's forms,
SFT, log, delete_checkpoints by ART's metric name) runs unchanged but for its imports.
"""

from __future__ import annotations

import asyncio

import pytest
from openai.types.chat.chat_completion import Choice
from pydantic import BaseModel

import agentrl
import agentrl.art as art
from agentrl.art.utils import iterate_dataset, limit_concurrency
from agentrl.art.utils.litellm import convert_litellm_choice_to_openai
from agentrl.records.step_metrics import with_art_names


class EmailConfig(BaseModel):
    max_turns: int = 4


def test_art_trains_cispo_by_default_and_epsilons_clip_the_selected_loss():
    from agentrl.art.training import agentrl_train_config

    default = agentrl_train_config({})
    assert default.loss == agentrl.CISPOLoss(clip_low=1.0, clip_high=4.0) and default.learning_rate == 5e-6
    assert agentrl_train_config({"epsilon": 0.5, "epsilon_high": 2.0}).loss == agentrl.CISPOLoss(
        clip_low=0.5, clip_high=2.0
    )
    assert agentrl_train_config({"loss_fn": "ppo"}).loss == agentrl.PPOLoss(clip_low=0.2, clip_high=0.2)
    assert agentrl_train_config({"ppo": True, "epsilon": 0.1, "epsilon_high": 0.3}).loss == agentrl.PPOLoss(
        clip_low=0.1, clip_high=0.3)  # fmt: skip
    for level in ("sequence", "average", "geometric_average"):
        assert agentrl_train_config({"importance_sampling_level": level}).loss.importance_sampling_level == level
    mapped = agentrl_train_config({"kl_penalty_coef": 0.05, "scale_rewards": False, "truncated_importance_sampling": 2.0,
                                   "packed_sequence_length": 4096, "allow_training_without_logprobs": True})  # fmt: skip
    assert (mapped.kl_advantage_coef, mapped.kl_coef) == (0.05, 0.0)  # ART's kl_penalty_coef shapes advantages
    assert (mapped.scale_advantages_by_std, mapped.truncated_importance_sampling) == (False, 2.0)
    assert agentrl_train_config({"advantage_balance": 0.3}).advantage_settings == {"scale_by_std": True, "balance": 0.3}
    shaped = agentrl_train_config({"max_negative_advantage_importance_sampling_weight": 2.5, "mask_prob_ratio": True})
    assert (shaped.loss.ratio_cap, shaped.loss.mask_out_of_range) == (2.5, True)
    sampled = agentrl_train_config({"kl_penalty_coef": 0.1, "kl_penalty_source": "sample", "kimi_k2_tau": 0.2})
    assert (sampled.kl_advantage_source, sampled.advantage_logprob_tau, sampled.needs_reference) == (
        "sample",
        0.2,
        True,
    )
    assert mapped.micro_batch_tokens == 4096 and mapped.allow_training_without_logprobs
    assert agentrl_train_config({"beta": 0.04}).kl_coef == 0.04  # before ART 0.5.11
    # ART's defaults for the keys agentrl has no counterpart of ask for nothing, and pass
    assert agentrl_train_config({"advantage_balance": 0.0, "mask_prob_ratio": False, "precalculate_logprobs": True,
                                 "logprob_calculation_chunk_size": 512}).loss.name == "cispo"  # fmt: skip


@pytest.mark.parametrize(
    ("keys", "named"),
    [
        ({"adam_params": {"beta1": 0.8}}, "adam_params"),
        ({"loss_fn_config": {"clip": 1}}, "loss_fn_config"),
        ({"grad_accumulation_sequences": 4}, "grad_accumulation_sequences"),
        ({"loss_fn": "dapo"}, "loss_fn"),
        ({"megatron_topology": object()}, "megatron_topology"),
        ({"not_a_key": 1}, "not_a_key"),
    ],
)
def test_each_training_key_agentrl_cannot_honour_raises_naming_itself(keys, named):
    """`loss_fn_config` (ART's LocalBackend refuses it too), ART's Megatron and sequence-count accumulation."""
    from agentrl.art.training import agentrl_train_config

    with pytest.raises(agentrl.ConfigurationError, match=named):
        agentrl_train_config(keys)


def test_arts_optimizer_learning_rate_and_kl_reference_keys_are_honoured():
    """ART's optimizer (a step per trajectory, AdamW (0.9, 0.99), weight decay 0.1, clip 0.1), the learning rate
    scaled by the trajectory count,
    the KL reference as a checkpoint step, an adapter folder or (PipelineTrainer) a lag; ART's mean-|A| scaling."""
    from agentrl.art.training import agentrl_train_config

    art_default = agentrl_train_config({})  # ART's LocalBackend: a step per trajectory, AdamW (0.9, 0.99), wd 0.1
    assert (art_default.optimizer_step_per, art_default.adam_betas) == ("sequence", (0.9, 0.99))
    assert (art_default.weight_decay, art_default.max_grad_norm, art_default.learning_rate) == (0.1, 0.1, 5e-6)
    power = agentrl_train_config({"num_trajectories_learning_rate_multiplier_power": 0.5})
    assert power.learning_rate_sequence_power == 0.5 and power.scale_advantages_by_mean_abs
    kl = {"kl_penalty_coef": 0.1}
    assert agentrl_train_config({**kl, "kl_penalty_reference_step": 3}).kl_reference == 3
    assert (
        agentrl_train_config({**kl, "kl_ref_adapter_path": "/ref", "kl_penalty_reference_step": 3}).kl_reference
        == "/ref"
    )
    assert agentrl_train_config({**kl, "kl_penalty_step_lag": 2}).kl_reference == -3  # ART: step trained from - 2
    assert agentrl_train_config({**kl}).kl_reference is None  # the base model: ART's untrained step 0
    assert agentrl_train_config({"kl_penalty_reference_step": 3}).kl_reference is None  # no penalty: ART uses none
    with pytest.raises(ValueError, match="changes nothing"):
        agentrl.TrainConfig(kl_reference=3)
    from agentrl.art.pipeline_trainer import PipelineTrainer

    model = art.TrainableModel(name="m", project="p", base_model="base")
    pipeline = PipelineTrainer(model, None, None, [], None, kl_penalty_coef=0.1, kl_penalty_step_lag=2)
    config = pipeline.train_config  # ART's PipelineTrainer measures its KL from the sampler's logprobs
    assert (config.kl_advantage_source, config.kl_reference, config.adam_betas) == ("sample", -3, (0.9, 0.99))


def test_the_older_train_config_and_dev_config_merge():
    from agentrl.art.training import agentrl_train_config, merged_keys

    keys = merged_keys(
        art.TrainConfig(learning_rate=1e-5, beta=0.04), art.dev.TrainConfig(scale_rewards=False, ppo=True)
    )
    config = agentrl_train_config(keys)
    assert (config.learning_rate, config.kl_coef, config.scale_advantages_by_std) == (1e-5, 0.04, False)
    assert isinstance(config.loss, agentrl.PPOLoss)
    assert art.TrainConfig().learning_rate == 5e-6 and art.TrainConfig(kl_penalty_coef=0.1).kl_penalty_coef == 0.1


def test_models_take_arts_keywords_accessors_and_a_typed_config():
    judge = art.Model[EmailConfig](
        name="judge",
        project="p",
        inference_model_name="gpt-x",
        inference_base_url="http://127.0.0.1:9/v1",
        inference_api_key="sk-test",
        config=EmailConfig(max_turns=7),
    )
    assert judge.get_inference_name() == "gpt-x" and not judge.trainable
    assert judge.inference_base_url == "http://127.0.0.1:9/v1" and judge.inference_api_key == "sk-test"
    assert judge.litellm_completion_params() == {
        "model": "openai/gpt-x", "base_url": "http://127.0.0.1:9/v1", "api_key": "sk-test", "temperature": 1}  # fmt: skip
    assert judge.config.max_turns == 7  # the user's own typed settings, kept as given
    # a litellm-prefixed name reaches its provider unchanged
    assert art.Model(name="openai/gpt-4.1", project="p").litellm_completion_params()["model"] == "openai/gpt-4.1"
    together = art.Model(name="together_ai/meta-llama/Llama-3-8b", project="p", inference_base_url="http://h/v1")
    assert together.litellm_completion_params()["model"] == "together_ai/meta-llama/Llama-3-8b"
    agent = art.TrainableModel(name="agent", project="p", base_model="smollm2-135m-instruct", config=EmailConfig())
    assert agent.trainable and agent.get_inference_name() == "agent@0" and agent.get_inference_name(step=3) == "agent@3"
    assert agent.base_path == ".art"
    with pytest.raises(agentrl.AgentRLError, match="register"):
        _ = agent.inference_base_url  # no backend yet: says what to do
    with pytest.raises(agentrl.AgentRLError, match="register"):
        agent.backend()


def test_internal_config_translates_at_construction_or_assignment_and_refuses_the_rest():
    model = art.TrainableModel(name="a", project="p", lora_config=art.LoRAConfig(r=4, lora_alpha=8))
    assert (model.lora.rank, model.lora.alpha) == (4, 8)
    current = art.TrainableModel(name="a", project="p", lora_config=art.LoRAConfig(rank=4, alpha=8, dropout=0.1,
                                 use_gradient_checkpointing="unsloth", bias="none"))  # ART 0.5.18's keys  # fmt: skip
    assert current.lora_config == {
        "rank": 4,
        "alpha": 8,
        "dropout": 0.1,
        "target_modules": list(current.lora.target_modules),
    }
    with pytest.raises(agentrl.ConfigurationError, match="use_rslora=True has no counterpart"):
        art.TrainableModel(name="a", project="p", lora_config=art.dev.LoRAConfig(rank=4, use_rslora=True))
    model._internal_config = art.dev.InternalModelConfig(
        init_args=art.dev.InitArgs(max_seq_length=8192),
        engine_args=art.dev.EngineArgs(gpu_memory_utilization=0.7, tensor_parallel_size=2, enable_sleep_mode=True),
        peft_args=art.dev.PeftArgs(r=16, lora_alpha=32, target_modules=["q_proj", "v_proj"]),
    )
    assert (model.server.max_model_len, model.server.gpu_memory_utilization, model.server.tensor_parallel_size) == (
        8192, 0.7, 2)  # fmt: skip
    assert (model.lora.rank, model.lora.alpha, model.lora.target_modules) == (16, 32, ("q_proj", "v_proj"))
    built = art.TrainableModel(name="b", project="p", _internal_config={"init_args": {"max_seq_length": 2048}})
    assert built.server.max_model_len == 2048
    rebuilt = art.TrainableModel(**model.model_dump())  # art-e's round trip
    assert rebuilt.server == model.server and rebuilt.lora == model.lora and rebuilt.name == "a"
    with pytest.raises(agentrl.ConfigurationError, match=r"engine_args.swap_space"):  # never a ValidationError
        art.TrainableModel(name="c", project="p", _internal_config={"engine_args": {"swap_space": 8}})
    # the fork-pipeline script's hardware-free keys (ART 0.5.23's dev scripts)
    fork = art.TrainableModel(name="f", project="p", run_name="f-1", _internal_config={
        "init_args": {"load_in_4bit": False, "load_in_16bit": True},
        "engine_args": {"max_num_seqs": 8, "enforce_eager": True},
        "rollout_weight_update_mode": "step_lora", "vllm_runtime": {"mode": "managed"},
    })  # fmt: skip
    assert fork.server.extra_args == ("--max-num-seqs", "8", "--enforce-eager")
    for refused, named in (({"init_args": {"load_in_4bit": True}}, "load_in_4bit"),
                           ({"vllm_runtime": {"mode": "external", "server_url": "http://x"}}, "external"),
                           ({"rollout_weight_update_mode": "in_flight_lora"}, "in_flight_lora")):  # fmt: skip
        with pytest.raises(agentrl.ConfigurationError, match=named):
            art.TrainableModel(name="g", project="p", _internal_config=refused)
    with pytest.raises(agentrl.ConfigurationError, match="trainer_args"):
        model._internal_config = {"trainer_args": {"learning_rate": 1.0}}


def test_every_dev_name_is_a_typed_dict_or_says_what_to_do():
    for name in ("TrainConfig", "InternalModelConfig", "InitArgs", "EngineArgs", "PeftArgs", "TrainerArgs",
                 "LoRAConfig", "TrainSFTConfig", "OpenAIServerConfig", "ServerArgs", "TinkerArgs"):  # fmt: skip
        cls = getattr(art.dev, name)
        assert isinstance(cls(), dict) and hasattr(cls, "__annotations__"), name
    assert art.dev.is_dedicated_mode({"dedicated": True}) and not art.dev.is_dedicated_mode({})
    with pytest.raises(agentrl.ConfigurationError, match="trainer_device"):
        art.dev.validate_dedicated_config({"dedicated": True})
    with pytest.raises(agentrl.ConfigurationError, match="ServerConfig"):
        art.dev.get_openai_server_config()


def test_arts_metric_names_map_to_agentrls_and_are_recorded_beside_them():
    assert art.agentrl_metric("val/reward") == "val/reward_mean"
    assert art.agentrl_metric("train/reward_std_dev") == "train/reward_std"
    assert art.agentrl_metric("val/accuracy") == "val/accuracy"
    group = agentrl.TrajectoryGroup([agentrl.Trajectory(reward=1.0)] * 3, exceptions=[
        agentrl.RolloutException.from_exception(ValueError("x"))])  # fmt: skip
    named = with_art_names({"reward_mean": 1.0, "reward_std": 0.0}, [group])
    assert named["reward"] == 1.0 and named["reward_std_dev"] == 0.0 and named["exception_rate"] == 0.25


async def test_gather_takes_arts_max_exceptions_as_a_count_or_a_fraction():
    async def rollout(fail: bool) -> agentrl.Trajectory:
        if fail:
            raise ValueError("tool crashed")
        return agentrl.Trajectory(reward=1.0)

    def groups():
        return [art.TrajectoryGroup(rollout(i == 0) for i in range(4))]

    (kept,) = await art.gather_trajectory_groups(groups(), pbar_desc=None, max_exceptions=0.25)
    assert len(kept.trajectories) == 3 and len(kept.exceptions) == 1
    (kept,) = await art.gather_trajectory_groups(groups(), pbar_desc="gather", max_exceptions=1)
    assert len(kept.exceptions) == 1
    with pytest.raises(ValueError, match="tool crashed"):  # ART's default: none allowed; its own exception raised
        await art.gather_trajectory_groups(groups(), pbar_desc=None)

    async def split(group: art.TrajectoryGroup) -> list[art.TrajectoryGroup]:  # ART's after_each may return a list
        return [art.TrajectoryGroup(group.trajectories[:1]), art.TrajectoryGroup(group.trajectories[1:])]

    kept = await art.gather_trajectory_groups(groups(), pbar_desc=None, max_exceptions=1, after_each=split)
    assert [len(g.trajectories) for g in kept] == [1, 2]


async def test_utils_take_arts_keywords():
    batches = list(iterate_dataset(list(range(6)), groups_per_step=4, num_epochs=2, initial_step=1, use_tqdm=False))
    assert [(b.step, b.epoch, b.epoch_step) for b in batches] == [(1, 0, 1), (2, 1, 0), (3, 1, 1)]
    running = peak = 0

    @limit_concurrency(2)
    async def search(query: str) -> str:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.01)
        running -= 1
        return query

    await asyncio.gather(*(search(str(i)) for i in range(5)))
    assert peak == 2

    attempts = []

    @art.retry(max_attempts=2, delay=0.01)
    async def flaky() -> str:
        attempts.append(1)
        if len(attempts) == 1:
            raise TimeoutError
        return "ok"

    assert await flaky() == "ok" and len(attempts) == 2


def test_a_litellm_choice_converts_to_the_openai_choice_a_trajectory_keeps():
    from litellm.types.utils import Choices, Message

    choice = Choices(index=0, finish_reason="stop", message=Message(role="assistant", content="hi"))
    converted = convert_litellm_choice_to_openai(choice)
    assert converted.message.content == "hi" and converted.finish_reason == "stop"
    trajectory = art.Trajectory(messages_and_choices=[{"role": "user", "content": "hey"}, converted])
    assert trajectory.messages()[-1] == {"role": "assistant", "content": "hi"}


async def test_auto_trajectory_exists_only_inside_a_capture():
    assert art.auto_trajectory() is None
    with pytest.raises(RuntimeError, match="capture_auto_trajectory"):
        art.auto_trajectory(required=True)

    async def agent() -> None:
        art.auto_trajectory(required=True).reward = 0.5

    trajectory = await art.capture_auto_trajectory(agent())
    assert trajectory.reward == 0.5 and art.auto_trajectory() is None and "duration" in trajectory.metrics


async def test_pipeline_trainer_reads_scenarios_lazily_sync_and_async_and_passes_over_trained_ones():
    from agentrl.art.pipeline_trainer import _ScenarioSource
    from agentrl.client.dataset import content_ids

    read = []

    def endless():
        number = 0
        while True:
            number += 1
            read.append(number)
            yield {"n": number % 3}  # repeats: named as iterate_dataset names them (".1", ".2")

    ids = content_ids([{"n": 1}, {"n": 2}, {"n": 0}, {"n": 1}])
    source = _ScenarioSource(endless(), trained={f"0:{ids[1]}"})
    assert await source.next_batch(2) == ([{"n": 1}, {"n": 0}], [f"0:{ids[0]}", f"0:{ids[2]}"]) and read == [1, 2, 3]
    assert (await source.next_batch(1))[1] == [f"0:{ids[3]}"] and read == [1, 2, 3, 4]  # the repeat's own key

    async def three():
        for number in range(3):
            yield {"n": number}

    source = _ScenarioSource(three(), trained=())
    assert len((await source.next_batch(2))[0]) == 2 and len((await source.next_batch(2))[0]) == 1
    assert await source.next_batch(2) == ([], []) and source.stopped


async def test_calls_art_answers_rather_than_refuses():
    """Calls ART 0.5.18 runs that agentrl once refused: each answered as ART answers it."""
    from agentrl.art.rewards import ruler
    from agentrl.art.training import agentrl_train_config

    assert list(iterate_dataset([], groups_per_step=2)) == []  # ART yields nothing
    assert await ruler([]) == []  # ART scores nothing
    calls = []

    @art.retry(max_attempts=3, delay=0.01, backoff_factor=0.5, exceptions=(ValueError,))
    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ValueError("again")
        return "ok"

    assert flaky() == "ok" and len(calls) == 3  # a factor below 1 shortens the waits
    centred = agentrl_train_config({"normalize_advantages": False})
    assert centred.scale_advantages_by_std is False  # centred per group, not divided by the std


def test_arts_output_dirs_types_and_model_step_by_path(tmp_path):
    from agentrl.art import types
    from agentrl.art.utils import get_model_step, get_repo_root_path
    from agentrl.art.utils.output_dirs import get_model_dir, get_step_checkpoint_dir, get_trajectories_split_dir
    from agentrl.records.checkpoints import CheckpointStore

    assert types.TrainConfig is art.TrainConfig
    model = art.TrainableModel(name="m", project="p", base_path=str(tmp_path / "own"))
    assert get_model_dir(model, str(tmp_path)) == f"{tmp_path}/p/models/m"
    CheckpointStore(tmp_path / "p" / "models" / "m").save(3, lambda folder: None, {"metrics": {}})
    assert get_model_step(model, str(tmp_path)) == 3 and get_model_step(model) == 0  # its own base_path has none
    assert get_step_checkpoint_dir("/r", 3) == "/r/checkpoints/0003" and get_repo_root_path()
    with pytest.raises(agentrl.ConfigurationError, match="val-NNNN.jsonl"):
        get_trajectories_split_dir("/r", "val")


async def test_a_group_awaitable_that_raises_is_dropped_and_past_the_budget_its_own_error_raises():
    async def good() -> art.TrajectoryGroup:
        return art.TrajectoryGroup([art.Trajectory(reward=1.0), art.Trajectory(reward=0.0)])

    async def bad() -> art.TrajectoryGroup:
        raise KeyError("the environment broke")

    groups = await art.gather_trajectory_groups([good(), bad(), good()], max_exceptions=1, pbar_desc=None)
    assert [len(g.trajectories) for g in groups] == [2, 2]  # ART drops the failed one: no empty group
    assert all("_agentrl_art_awaited_group" not in g.metadata for g in groups)
    with pytest.raises(KeyError, match="the environment broke"):  # the rollout's own exception, not a wrapper
        await art.gather_trajectory_groups([good(), bad()], pbar_desc=None)


def test_a_prompted_models_names_take_the_step_as_arts():
    judge = art.Model(
        name="judge", project="p", inference_model_name="openai/gpt-4.1", inference_base_url="http://h/v1"
    )
    assert judge.get_inference_name() == "openai/gpt-4.1" and judge.get_inference_name(step=3) == "openai/gpt-4.1@3"
    assert judge.litellm_completion_params(step=3)["model"] == "openai/gpt-4.1@3"
    assert judge.litellm_completion_params()["model"] == "openai/gpt-4.1"


def test_openai_client_outside_a_running_loop_as_art_allows():
    model = art.Model(name="m", project="p", inference_base_url="http://127.0.0.1:9/v1", inference_api_key="k")
    client = model.openai_client()  # a script's set-up, before asyncio.run
    assert str(client.base_url).startswith("http://127.0.0.1:9/v1") and client is not model.openai_client()


async def test_gather_records_arts_completion_tokens_metric():
    """ART 0.5.20+: the sampled tokens of every choice, additional histories included, summed; not set when a
    choice does not say how many it sampled."""
    from tests.helpers import make_choice

    async def rollout() -> art.Trajectory:
        turns = [make_choice([1, 2, 3], [-0.1] * 3), {"role": "user", "content": "more"}, make_choice([4], [-0.2])]
        branch = art.LegacyHistory(
            messages_and_choices=[{"role": "user", "content": "b"}, make_choice([5, 6], [-0.1] * 2)]
        )
        return art.Trajectory(
            messages_and_choices=[{"role": "user", "content": "hi"}, *turns], reward=1.0, additional_histories=[branch]
        )

    (group,) = await art.gather_trajectory_groups([art.TrajectoryGroup([rollout()])], pbar_desc=None)
    assert group.trajectories[0].metrics["completion_tokens"] == 6.0  # 3 + 1 + 2, as ART 0.5.20+ sums
    (alone,) = await art.gather_trajectories([rollout()], pbar_desc=None)
    assert alone.metrics["completion_tokens"] == 6.0
    uncounted = Choice.model_validate(
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "x"}, "logprobs": None}
    )
    trajectory = art.Trajectory(messages_and_choices=[{"role": "user", "content": "x"}, make_choice([7]), uncounted])
    (unset,) = await art.gather_trajectories([_returning(trajectory)], pbar_desc=None)
    assert "completion_tokens" not in unset.metrics  # one choice does not say: ART sets none


async def _returning(trajectory):
    return trajectory


def test_a_groups_log_and_a_models_safe_dump_as_arts():
    group = art.TrajectoryGroup([art.Trajectory(reward=1.0)])
    group.log("judged by RULER")
    assert group.logs == ["judged by RULER"]
    model = art.TrainableModel(name="m", project="p", config={"not": object()})
    dumped = model.safe_model_dump()
    assert dumped["config"] is None and dumped["name"] == "m"


def test_a_train_result_is_a_plain_record_as_arts():
    result = art.TrainResult(step=3, metrics={"loss": 0.1})
    result.metrics["note"] = 1.0
    result.step = 4  # ART's TrainResult is a mutable dataclass
    assert (result.step, result.metrics) == (4, {"loss": 0.1, "note": 1.0})


async def test_arts_deployment_module_imports_and_deploying_raises_naming_itself():
    """tic-tac-toe.py imports `art.utils.deployment` at its top: the import works, deploying says what to do."""
    from agentrl.art.utils.deployment import TogetherDeploymentConfig, deploy_model
    from agentrl.art.utils.deployment.wandb import deploy_wandb

    model = art.TrainableModel(name="llama-8b-007", project="tic-tac-toe")
    config = TogetherDeploymentConfig(s3_bucket="b", wait_for_completion=True)
    with pytest.raises(agentrl.ConfigurationError, match="deploy_model.*agentrl serve tic-tac-toe/llama-8b-007"):
        await deploy_model(model=model, checkpoint_path="/c", step=50, provider="together", config=config)
    with pytest.raises(agentrl.ConfigurationError, match="deploy_wandb"):
        deploy_wandb(model, "/c", 50, verbose=True)


async def test_arts_s3_utilities_move_runs_by_project_and_name(tmp_path, monkeypatch):
    from agentrl.art.utils import s3
    from agentrl.records.checkpoints import CheckpointStore

    monkeypatch.setenv("BACKUP_BUCKET", "runs")
    assert (
        s3.build_s3_path(model_name="m", project="p", step=3, prefix="exp")
        == "s3://runs/exp/p/models/m/checkpoints/0003"
    )
    bucket = tmp_path / "bucket"
    await s3.ensure_bucket_exists(str(bucket))
    store = CheckpointStore(tmp_path / "here" / "p" / "models" / "m")
    for step in (0, 1):
        store.save(step, lambda folder, s=step: (folder / "adapter_model.safetensors").write_bytes(bytes([s])), {})
    await s3.push_model_to_s3("m", "p", s3_bucket=str(bucket), art_path=str(tmp_path / "here"))
    pulled = await s3.pull_model_from_s3("m", "p", step=1, s3_bucket=str(bucket), art_path=str(tmp_path / "there"))
    assert pulled == str(tmp_path / "there" / "p" / "models" / "m")
    assert sorted(p.name for p in (tmp_path / "there" / "p" / "models" / "m" / "checkpoints").iterdir()) == ["0001"]
    with pytest.raises(agentrl.ConfigurationError, match="s3_sync"):
        await s3.s3_sync()


def test_a_trajectory_takes_stated_policy_versions_as_arts():
    stated = art.Trajectory(initial_policy_version=3, final_policy_version=4, reward=1.0)
    assert (stated.initial_policy_version, stated.final_policy_version) == (3, 4)
    again = art.Trajectory.model_validate_json(stated.model_dump_json())  # kept through a save and a load
    assert (again.initial_policy_version, again.final_policy_version) == (3, 4)
    assert art.Trajectory(reward=0.0).initial_policy_version is None  # none stated, no stamped turn


def test_arts_dev_types_and_metrics_builder_answer_by_name():
    config = art.dev.BackendModelConfig(init_args={"max_seq_length": 2048}, lora_config={"rank": 8})
    native = art.dev.TinkerNativeArgs(renderer_name="llama3")
    assert config["lora_config"] == {"rank": 8} and native["renderer_name"] == "llama3"  # plain dicts, as ART's
    with pytest.raises(agentrl.ConfigurationError, match="metrics_builder"):
        art.TrainableModel(name="m", project="p").metrics_builder()


def test_a_key_art_applies_nowhere_is_accepted_with_a_warning(caplog):
    import logging

    from agentrl.art.training import agentrl_train_config

    with caplog.at_level(logging.WARNING):
        config = agentrl_train_config({"scale_learning_rate_by_reward_std_dev": True, "learning_rate": 1e-5})
    assert config.learning_rate == 1e-5 and "changes nothing" in caplog.text  # ART 0.5.18 applies it nowhere either
