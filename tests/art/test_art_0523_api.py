"""ART 0.5.23's surface without a server: run_name as the run's identity, the capture API's scoping and ordering,
PipelineTrainer's new keywords, LegacyHistory, any-type metadata, the new names, and each refusal naming itself."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import agentrl
import agentrl.art as art


def test_run_name_names_the_run_and_name_the_served_model(tmp_path):
    from agentrl.art.utils.output_dirs import get_model_dir

    model = art.TrainableModel(name="alias", run_name="run-001", project="p", base_path=str(tmp_path))
    assert model.run_dir == tmp_path / "p" / "models" / "run-001"
    assert get_model_dir(model, str(tmp_path)).endswith("p/models/run-001")
    old = art.TrainableModel(name="alias", project="p", base_path=str(tmp_path))  # ART 0.5.18's form
    assert old.run_name == "alias" and old.run_dir == tmp_path / "p" / "models" / "alias"
    with pytest.raises(agentrl.ConfigurationError, match="run_name"):
        art.TrainableModel(name="a", run_name="../elsewhere", project="p")


async def test_the_capture_api_scopes_and_orders_as_arts():
    assert art.current_trajectory() is None
    with pytest.raises(RuntimeError, match="No trajectory is active"):
        art.current_trajectory(require=True)

    async def rollout(reward: float, delay: float) -> None:
        await asyncio.sleep(delay)
        assert art.current_trajectory(require=True) is not None
        with art.no_capture():
            assert art.current_trajectory() is None  # hidden inside, ...
            with art.Trajectory() as nested:
                assert art.current_trajectory() is nested  # ... while a new scope still opens
        art.current_trajectory(require=True).reward = reward

    done = await art.trajectory(rollout(1.0, 0))
    assert done.reward == 1.0 and "duration" in done.metrics
    task = asyncio.ensure_future(asyncio.sleep(0))
    with pytest.raises(TypeError, match="raw coroutine"):
        await art.trajectory(task)
    await task

    async def failing() -> art.Trajectory:
        raise ValueError("boom")

    group = await art.trajectory_group(
        [art.trajectory(rollout(3.0, 0.02)), art.trajectory(rollout(2.0, 0)), failing()],
        metadata={"scenario": {"id": 7, "tags": ["a"]}},
        return_exceptions=True,
    )
    assert group.rewards == [3.0, 2.0]  # input order, not completion order
    assert len(group.exceptions) == 1 and group.metadata["scenario"]["tags"] == ["a"]
    with pytest.raises(ValueError, match="boom"):
        await art.trajectory_group([art.trajectory(rollout(1.0, 0.05)), failing()])


def test_legacy_history_any_metadata_and_the_new_names():
    history = art.LegacyHistory(messages_and_choices=[{"role": "user", "content": "hi"}])
    trajectory = art.Trajectory(additional_histories=[history], metadata={"nested": {"a": [1, 2]}, "list": [1]})
    assert trajectory.metadata["nested"]["a"] == [1, 2]
    assert art.Trajectory.model_validate_json(trajectory.model_dump_json()).metadata == trajectory.metadata
    with pytest.raises(agentrl.ConfigurationError, match="exchanges"):
        _ = trajectory.exchanges
    with pytest.raises(agentrl.ConfigurationError, match="exchanges"):
        art.Trajectory(exchanges={"chat_completions": [{}]})
    assert trajectory.history().messages() == []
    assert issubclass(art.LocalServingUnavailableError, agentrl.ServerError)
    for refused in (art.tokenize, art.tensorize, art.init_megatron_runtime_config, art.MegatronRuntimeConfig):
        with pytest.raises(agentrl.ConfigurationError, match="no counterpart"):
            refused()
    assert art.PIPELINE_RL_SCORE_METRICS == ("train/reward_mean",)
    assert set(art.PIPELINE_RL_DASHBOARD_DEFAULT_METRICS) <= {d.key for d in art.PIPELINE_RL_METRIC_DEFINITIONS}
    assert art.dev.is_external_vllm_mode({"vllm_runtime": {"mode": "external"}})
    assert art.get_tokenizer("smollm2-135m-instruct").encode("hi")


def test_new_training_keywords_are_taken_or_refused_by_name():
    from agentrl.art.training import agentrl_train_config

    config = art.TrainConfig(learning_rate=1e-5, optimizer_save_interval=3, final_training_step=10)
    assert config.optimizer_save_interval == 3
    agentrl_train_config({"optimizer_save_interval": 5, "final_training_step": None, "grad_accumulation_sequences": 1})
    for keys, named in (({"optimizer_save_interval": 0}, "optimizer_save_interval"),
                        ({"grad_accumulation_sequences": 4}, "grad_accumulation_sequences"),
                        ({"adam_params": {"beta1": 0.8}}, "adam_params")):  # fmt: skip
        with pytest.raises(agentrl.ConfigurationError, match=named):
            agentrl_train_config(keys)
    assert art.TrainSFTConfig(assistant_turns="last").assistant_turns == "last"


def test_pipeline_trainers_new_keywords_and_their_refusals():
    from agentrl.art.pipeline_trainer import PipelineTrainer

    model = art.TrainableModel(name="m", project="p", base_model="base")
    unlimited = PipelineTrainer(model, None, None, [], None, max_steps_off_policy=None,
                                pipeline=art.PipelineRuntimeConfig(num_rollout_workers=8, min_batch_size=2))  # fmt: skip
    assert (unlimited.drop_stale, unlimited.max_steps_off_policy) == (False, 4)  # ahead as far as 8 workers reach
    for keywords, named in (({"autotune": art.PipelineAutotuneConfig(mode="online")}, "autotune"),
                            ({"limit_mean_steps_off_policy": 2.0}, "limit_mean_steps_off_policy"),
                            ({"rollout_executor": object()}, "rollout_executor"),
                            ({"grad_accumulation_sequences": 2}, "grad_accumulation_sequences")):  # fmt: skip
        with pytest.raises(agentrl.ConfigurationError, match=named):
            PipelineTrainer(model, None, None, [], None, **keywords)
    with pytest.raises(agentrl.ConfigurationError, match="max_batch_size"):
        PipelineTrainer(model, None, None, [], None, min_batch_size=4, max_batch_size=2)


def test_init_chat_model_forms(monkeypatch):
    pytest.importorskip("langchain_openai")
    from agentrl.art.langgraph import init_chat_model

    class Served:  # what init_chat_model reads of a registered model
        inference_base_url, inference_api_key = "http://127.0.0.1:9/v1", "k"

        def get_inference_name(self) -> str:
            return "agent@3"

    assert init_chat_model(Served()).model_name == "agent@3"
    named = init_chat_model(Served(), temperature=0.3)
    assert named.temperature == 0.3 and named.request_timeout == 600.0
    instance = object()
    assert init_chat_model(instance) is instance
    with pytest.raises(agentrl.ConfigurationError, match="model_provider"):
        init_chat_model(Served(), model_provider="anthropic")
    with pytest.raises(ValueError, match="configurable_fields"):
        init_chat_model(configurable_fields=("model",))  # type: ignore[arg-type]


def test_sft_trains_only_the_last_assistant_turn_when_asked(tiny_model_path):
    from agentrl.backend.training.trainer import Trainer

    trainer = Trainer(tiny_model_path, seed=0)
    trainer.add_adapter("default", agentrl.LoRAConfig())
    demo = agentrl.History(messages_and_choices=[
        {"role": "user", "content": "a"}, {"role": "assistant", "content": "one two three"},
        {"role": "user", "content": "b"}, {"role": "assistant", "content": "four"},
    ])  # fmt: skip
    every = trainer.sft_step("default", [demo], learning_rate=1e-4, micro_batch_tokens=None).metrics
    last = trainer.sft_step("default", [demo], learning_rate=1e-4, micro_batch_tokens=None, assistant_turns="last")
    assert 0 < last.metrics["trained_tokens"] < every["trained_tokens"]
    assert Path(tiny_model_path).exists()


def test_coming_from_arts_tables_are_the_codes():
    """docs/coming-from-art.md's training-key and optimizer tables are what scripts/coming_from_art.py makes now."""
    import importlib.util

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("coming_from_art", root / "scripts" / "coming_from_art.py")
    assert spec is not None and spec.loader is not None
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    page = (root / "docs" / "coming-from-art.md").read_text()
    assert f"{generator.KEYS_START}\n{generator.keys_table()}\n{generator.KEYS_END}" in page
    assert f"{generator.OPTIMIZER_START}\n{generator.optimizer_table()}\n{generator.OPTIMIZER_END}" in page
