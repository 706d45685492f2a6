"""The run's timeline (`timeline.json`, a Chrome/Perfetto trace): rollouts, judging, the trainer's calls and
micro-batches, the checkpoint and the swap, through the real step transaction on the tiny model."""

import asyncio

import agentrl
from agentrl.cli import app
from agentrl.foundation.timeline import (
    TIMELINE_FILE,
    Span,
    append_timeline,
    busy_seconds,
    read_timeline,
    recorder,
    sampling,
    trace_events,
)
from tests.helpers import AdapterSlots, model_on_a_server_seam, runner, spans_by_track, synthetic_groups


async def gathered(groups: list[agentrl.TrajectoryGroup]) -> list[agentrl.TrajectoryGroup]:
    """The groups as rollouts that take a moment each, through a gather with a judge-like `after_each`."""

    async def rollout(trajectory: agentrl.Trajectory) -> agentrl.Trajectory:
        await asyncio.sleep(0.02)
        return trajectory

    async def judge(group: agentrl.TrajectoryGroup) -> agentrl.TrajectoryGroup:
        await asyncio.sleep(0.01)
        return group

    pending = [agentrl.TrajectoryGroup(rollout(t) for t in g.trajectories) for g in groups]
    return await agentrl.gather_trajectory_groups(pending, after_each=judge, show_progress=False)


async def test_each_step_appends_its_phases_to_a_trace_a_viewer_reads(tiny_model_path, tokenizer, tmp_path):
    model = model_on_a_server_seam(tiny_model_path, tmp_path, AdapterSlots(), trainer_device="cpu").model
    recorder.take()  # what earlier tests in this process recorded (one recorder per process)
    config = agentrl.TrainConfig(learning_rate=1e-3, micro_batch_tokens=128)  # several micro-batches
    sampling_s = 0.0  # what the live clock `train_pipelined` reads says the rollouts took
    for seed in (1, 2):
        before = sampling.busy_s()
        groups = await gathered(synthetic_groups(tokenizer, seed=seed, size=3, max_words=10))
        sampling_s += sampling.busy_s() - before
        await model.train(groups, config)
    path = model.run_dir / TIMELINE_FILE
    text = path.read_text()
    assert text.startswith("[\n") and all(line.endswith(",") for line in text.splitlines()[1:])  # appendable form
    tracks = spans_by_track(read_timeline(path))

    rollouts = {track: spans for track, spans in tracks.items() if track.startswith("rollouts ")}
    assert sum(len(spans) for spans in rollouts.values()) == 2 * 9  # every rollout of both steps
    for spans in rollouts.values():  # a track's spans never overlap: the format's rule
        ordered = sorted(spans, key=lambda e: e["ts"])
        assert all(a["ts"] + a["dur"] <= b["ts"] for a, b in zip(ordered, ordered[1:]))
    assert len(tracks["judge"]) == 6 and {e["name"] for e in tracks["judge"]} == {"after each (judge)"}

    trainer = tracks["trainer"]
    steps = [e for e in trainer if e["name"] == "train_step"]
    micro_batches = [e for e in trainer if e["name"] == "train step: micro-batch"]
    assert len(steps) == 2 and len(micro_batches) >= 4 and {"save"} <= {e["name"] for e in trainer}
    for mb in micro_batches:  # nested in its step, on the same track
        assert any(s["ts"] <= mb["ts"] and mb["ts"] + mb["dur"] <= s["ts"] + s["dur"] for s in steps)
    assert [e["args"]["step"] for e in tracks["server"] if e["name"] == "swap"] == [1, 2]

    window_s, busy = busy_seconds(read_timeline(path))
    # The clock `train_pipelined` reads live agrees with the trace's rollout spans, to the rounding.
    assert abs(busy["rollouts"] - sampling_s) < 0.005
    assert 0 < busy["rollouts"] < busy["rollouts"] + busy["trainer"] <= window_s
    drawn = runner.invoke(app, ["timeline", str(model.run_dir)])
    assert drawn.exit_code == 0, drawn.output
    assert f"busy over the {window_s:.0f} s recorded: judge " in drawn.output and " rollouts " in drawn.output
    assert (model.run_dir / "timeline.png").read_bytes().startswith(b"\x89PNG")


def test_a_line_a_crash_tore_is_cut_off_before_the_next_append(tmp_path):
    append_timeline(tmp_path, [Span("a", "t", 1.0, 2.0)])
    with open(tmp_path / TIMELINE_FILE, "ab") as file:
        file.write(b'{"ph":"X","name":"torn')  # a crash in the middle of a write
    append_timeline(tmp_path, [Span("b", "t", 3.0, 4.0, {"n": 1})])
    events = [e for e in read_timeline(tmp_path / TIMELINE_FILE) if e["ph"] == "X"]
    assert [(e["name"], e["ts"], e["dur"]) for e in events] == [
        ("a", 1_000_000, 1_000_000),
        ("b", 3_000_000, 1_000_000),
    ]


def test_busy_seconds_count_overlapping_spans_once_per_kind_of_track():
    spans = [
        Span("rollout", "rollouts 000", 0.0, 4.0),
        Span("rollout", "rollouts 001", 1.0, 2.0),  # inside the first: no more busy time
        Span("rollout", "rollouts 001", 3.0, 6.0),  # overlaps its end: 2 s more
        Span("rollout", "rollouts 000", 8.0, 9.0),  # after a 2 s gap
        Span("train_step", "trainer", 6.0, 8.0),
        Span("train step: micro-batch", "trainer", 6.5, 7.0),  # nested
    ]
    window_s, busy = busy_seconds(trace_events(spans))
    assert window_s == 9.0 and busy == {"rollouts": 7.0, "trainer": 2.0}
