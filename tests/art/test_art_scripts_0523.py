"""ART 0.5.23's script forms (../shared/art-0.5.23.md), written as ART 0.5.23 users write them, with only the import
lines changed, on the real server with the packaged model and the package's shared ART `LocalBackend`:

- `TrainableModel(name=..., run_name=...)`: the run named by `run_name` (folder, object-storage keys), the served
  model by `name`;
- the capture API: rollouts that never build a trajectory themselves (`art.trajectory(coro)`,
  `art.current_trajectory(require=True)`, `with art.Trajectory()`, `art.no_capture()` around a judge's call,
  `art.trajectory_group(...)`), trained with `backend.train(model, groups, learning_rate=...)`;
- PipelineTrainer's new form: `pipeline=art.PipelineRuntimeConfig(...)`, `autotune=`, `max_steps_off_policy=None`,
  `optimizer_save_interval=`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

# --- the import lines: the only lines an ART script changes ---
import agentrl.art as art  # was: import art
from agentrl.art.pipeline_trainer import PipelineTrainer  # was: from art.pipeline_trainer import PipelineTrainer
from agentrl.foundation.errors import ConfigurationError  # the test's own check, not a script's

pytestmark = pytest.mark.slow

WORDS = ("left", "right", "up", "down")


async def play(model: art.TrainableModel, seed: int) -> None:
    """A two-turn game whose turns are captured, not appended by hand; a judge call in between stays out."""
    client = model.openai_client()
    messages = [{"role": "system", "content": "Answer with one word: left, right, up or down."},
                {"role": "user", "content": f"Board {seed}. Your move?"}]  # fmt: skip
    moves = 0
    for turn in range(2):
        completion = await client.chat.completions.create(
            model=model.get_inference_name(), messages=messages, max_completion_tokens=6
        )
        answer = completion.choices[0].message.content or ""
        messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": f"Turn {turn + 2}?"}]
        moves += any(w in answer.lower() for w in WORDS)
        with art.no_capture():  # a judge's own call (here the same server): never part of the trajectory
            await client.chat.completions.create(
                model=model.get_inference_name(), messages=[{"role": "user", "content": "Rate it."}], max_tokens=2
            )
    trajectory = art.current_trajectory(require=True)
    trajectory.reward = moves + len(answer) / 100  # the last answer's length: rewards differ within a group
    trajectory.metadata["board"] = {"seed": seed, "moves": [moves]}  # any-type metadata (ART 0.5.20+)


async def test_a_0_5_23_loop_with_run_name_and_the_capture_api_trains(backend, base_model, tmp_path):
    model = art.TrainableModel(name="agent-0523", run_name="2048-run-a", project="2048-0523", base_model=base_model)
    await model.register(backend)
    assert model.run_dir == Path(backend._path) / "2048-0523" / "models" / "2048-run-a"
    assert model.get_inference_name().startswith("agent-0523@")  # served by name, stored by run_name
    assert model.server.max_model_len == 8192  # ART 0.5.20+: the context length from the model's config

    groups = [
        await art.trajectory_group(art.trajectory(play(model, seed)) for seed in range(s, s + 4)) for s in (0, 10)
    ]
    trajectories = [t for g in groups for t in g.trajectories]
    assert len(trajectories) == 8 and all(len(t.choices()) == 2 for t in trajectories)  # the judge calls stayed out
    assert all(c.model_extra.get("token_ids") for t in trajectories for c in t.choices())  # the engine's own tokens
    assert all(t.metadata["board"]["moves"] and "duration" in t.metrics for t in trajectories)
    with art.Trajectory(reward=1.0) as scoped:  # the block form records the same way
        await model.openai_client().chat.completions.create(
            model=model.get_inference_name(), messages=[{"role": "user", "content": "Hi"}], max_tokens=3
        )
        assert art.current_trajectory() is scoped
    assert len(scoped.choices()) == 1 and art.current_trajectory() is None
    with art.Trajectory(messages_and_choices=[{"role": "user", "content": "Hi"}]) as built:  # built by hand
        completion = await model.openai_client().chat.completions.create(
            model=model.get_inference_name(), messages=built.messages(), max_tokens=3
        )
        built.messages_and_choices.append(completion.choices[0])
    assert len(built.choices()) == 1  # the call was not captured into it as well (ART ignores it there too)

    result = await backend.train(model, groups, learning_rate=1e-5)
    await model.log(groups, metrics=result.metrics, step=result.step, split="train")
    kept = [g for g in groups if len(set(g.rewards)) > 1]
    answers = [(g.rewards, [[c.message.content for c in t.choices()] for t in g.trajectories]) for g in groups]
    assert not result.skipped and result.step == 1, answers  # the sampled answers, where every reward was equal
    # One AdamW step per training sequence, as ART's LocalBackend: a trajectory is one sequence, or more where a turn's
    # prompt does not extend the tokens sampled before it (ART starts a new sequence there too).
    assert result.metrics["optimizer_steps"] == result.metrics["num_sequences"] >= 4 * len(kept)
    assert (
        result.metrics["loss/grad_norm"] == result.metrics["grad_norm"]
        and "time/step_backend_train_s" in result.metrics
    )
    assert (model.run_dir / "checkpoints").is_dir() and result.checkpoint_ready is None

    pushed = await backend._experimental_push_to_s3(model, s3_bucket=str(tmp_path / "bucket"))
    assert pushed.endswith("2048-0523/models/2048-run-a/")  # object-storage keys by run_name too


async def test_pipeline_trainers_0_5_23_form_trains(backend, base_model):
    model = art.TrainableModel(name="pipe-0523", run_name="pipe-run-a", project="pipeline-0523", base_model=base_model)
    await model.register(backend)

    async def one(scenario: dict) -> None:
        completion = await model.openai_client().chat.completions.create(
            model=model.get_inference_name(), messages=[{"role": "user", "content": scenario["q"]}], max_tokens=10
        )
        art.current_trajectory(require=True).reward = len(completion.choices[0].message.content or "") / 100

    async def rollout_fn(model: art.TrainableModel, scenario: dict, config: dict) -> art.TrajectoryGroup:
        return await art.trajectory_group(art.trajectory(one(scenario)) for _ in range(3))

    scenarios = [{"q": q} for q in ("Name a fruit.", "Name a city.", "Name a tool.")]
    trainer = PipelineTrainer(
        model, backend, rollout_fn, scenarios, {},
        pipeline=art.PipelineRuntimeConfig(num_rollout_workers=3, min_batch_size=1, max_batch_size=1),
        autotune=art.PipelineAutotuneConfig(mode="off"), max_steps_off_policy=None, optimizer_save_interval=5,
        max_steps=2, learning_rate=1e-5, eval_at_start=False,
    )  # fmt: skip
    results = await trainer.train()
    assert results and await model.get_step() == results[-1].step
    assert any(not r.skipped for r in results)
    # dev/yes-no-maybe-fork-pipeline.py in 0.5.23's form: fork the run (its folder named by run_name) into a fresh
    # run under another name, with the script's hardware-free _internal_config keys, and train on from there.
    from agentrl.art.utils.output_dirs import get_model_dir, get_step_checkpoint_dir

    step = await model.get_step()
    assert Path(get_step_checkpoint_dir(get_model_dir(model, backend._path), step)).is_dir()
    forked = art.TrainableModel(
        name="pipe-0523-fork", run_name="pipe-run-b", project="pipeline-0523", base_model=base_model,
        _internal_config=art.dev.InternalModelConfig(
            init_args={"load_in_4bit": False, "load_in_16bit": True},
            engine_args={"max_num_seqs": 16, "enforce_eager": True},
        ),
    )  # fmt: skip
    await backend._experimental_fork_checkpoint(forked, from_model=model.run_name, from_project=model.project)
    await forked.register(backend)
    assert await forked.get_step() == step and forked.run_dir.name == "pipe-run-b"
    again = PipelineTrainer(
        forked, backend, rollout_fn, scenarios, {}, max_steps=1, eval_at_start=False, learning_rate=1e-5,
        pipeline=art.PipelineRuntimeConfig(num_rollout_workers=3, min_batch_size=1, max_batch_size=1),
    )  # fmt: skip
    await again.train()
    assert step <= await forked.get_step() <= step + 1

    with pytest.warns(DeprecationWarning, match="pipeline=PipelineRuntimeConfig"):
        PipelineTrainer(model, backend, rollout_fn, scenarios, {}, min_batch_size=2)
    with pytest.raises(ConfigurationError, match="deprecated keywords"):
        PipelineTrainer(model, backend, rollout_fn, scenarios, {}, min_batch_size=2,
                        pipeline=art.PipelineRuntimeConfig())  # fmt: skip
