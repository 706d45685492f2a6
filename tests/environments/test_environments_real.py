"""Both environments' rollouts against the project's vLLM server and the packaged model (small limits)."""

import math
from dataclasses import replace

import agentrl
from agentrl_environments.email_agent.env import PRESETS as EMAIL_PRESETS
from agentrl_environments.email_agent.env import EmailEnvironment, demonstration, evaluate
from agentrl_environments.email_agent.env import rollout as email_rollout
from agentrl_environments.email_agent.grading import grade_answer
from agentrl_environments.email_agent.train import ruler_rewards
from agentrl_environments.training import judge_for
from agentrl_environments.twenty_forty_eight.env import PRESETS as GAME_PRESETS
from agentrl_environments.twenty_forty_eight.env import rollout as game_rollout
from agentrl_environments.twenty_forty_eight.env import scenarios as game_scenarios
from tests.helpers import assert_context_exact


async def test_2048_rollouts_play_real_games(served_model):
    preset = GAME_PRESETS["cpu"]
    games = game_scenarios("test", 3, preset)
    trajectories = await agentrl.gather_trajectories(
        (game_rollout(served_model, g) for g in games), show_progress=False
    )
    assert len(trajectories) == 3
    for t in trajectories:
        assert 0.0 <= t.reward <= 1.0
        assert t.metrics["moves"] <= preset.max_moves and t.metrics["max_tile"] >= 2
        turns = t.histories()
        assert len(turns) == t.metrics["moves"] + t.metrics["invalid_move"] or t.metrics["moves"] == preset.max_moves
        for turn in turns:  # bounded context: every turn is system + current board + one sampled move
            assert len(turn.messages_and_choices) == 3 and len(turn.choices()) == 1


async def test_email_rollouts_call_tools_against_sqlite_and_train_sft(served_model):
    env = EmailEnvironment.load()
    preset = EMAIL_PRESETS["cpu"]
    questions = env.data.split("test")[:3]
    trajectories = await agentrl.gather_trajectories(
        (email_rollout(served_model, q, env, max_turns=2, max_tokens=64) for q in questions), show_progress=False
    )
    for t in trajectories:
        assert math.isfinite(t.reward) and t.reward >= 0
        assert 1 <= t.metrics["turns"] <= 2 and 0.0 <= t.metrics["valid_tool_call_rate"] <= 1.0
        assert t.tools is not None and len(t.choices()) == t.metrics["turns"]
    short = replace(preset, max_turns=2, max_tokens=64)
    metrics = await served_model.log(await evaluate(served_model, questions[:2], env, short), split="val")
    assert set(metrics) >= {"reward_mean", "correct", "valid_tool_call_rate"}
    assert (served_model.run_dir / "transcripts").is_dir() and (served_model.run_dir / "reward.png").exists()

    # The warm start: supervised training on demonstrations makes a checkpoint that the server serves.
    step = await served_model.get_step()
    result = await served_model.train_sft(
        [demonstration(q, env) for q in env.data.split("train")[:2]], agentrl.SFTConfig(epochs=1)
    )
    assert (
        result.step == step + 1 and math.isfinite(result.metrics["sft_loss"]) and result.metrics["trained_tokens"] > 0
    )
    completion = await served_model.openai_client().chat.completions.create(
        model=served_model.inference_name, messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert completion.choices[0].message.content is not None

    # Episodes of up to 6 turns from the warm-started agent: every turn trains in the prompt vLLM sampled it from.
    episodes = await agentrl.gather_trajectories(
        (email_rollout(served_model, q, env, max_turns=6, max_tokens=64) for q in questions[:2]), show_progress=False
    )
    backend = served_model._backend
    assert assert_context_exact(episodes, backend.gateway.store, backend.trainer.tokenizer) == sum(
        len(t.choices()) for t in episodes
    )


async def test_email_training_rewards_from_judges_on_the_local_server(served_model):
    """`agentrl train email --reward ruler|judge` with the default judge: the base model on the run's server."""
    env = EmailEnvironment.load()
    question = env.data.split("test")[0]
    group = agentrl.TrajectoryGroup(
        email_rollout(served_model, question, env, max_turns=2, max_tokens=64) for _ in range(3)
    )
    groups = await agentrl.gather_trajectory_groups(
        [group], after_each=ruler_rewards(served_model, judge=None), show_progress=False
    )
    assert len(groups) == 1 and groups[0].trajectories, f"the local judge failed: {groups[0].exceptions}"
    for t in groups[0].trajectories:
        assert t.reward == t.metrics["ruler_score"] and 0.0 <= t.reward <= 1.0
        assert "independent_reward" in t.metrics and t.logs[-1].startswith("RULER: ")
    # A free-text answer goes to the judge (a real structured call through litellm); its verdict is a bool.
    judge = judge_for(served_model, None)
    assert judge.name == "base" and judge.base_url == served_model.backend.base_url
    assert isinstance(await grade_answer("It was changed, as the email says.", question, judge), bool)
