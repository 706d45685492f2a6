"""`agentrl runs`, `show`, `replay`, `whatif` and `serve`: read run folders, train recorded steps again (in
memory, or into a new run), and serve a checkpoint, never writing to an existing run."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import typer

from agentrl.cli.app import app, base_model_server, fmt, resolve_run_option
from agentrl.foundation.errors import CheckpointError, ConfigurationError
from agentrl.foundation.files import check_safe_name
from agentrl.foundation.sampled_record import served_name
from agentrl.foundation.timeline import TIMELINE_FILE, busy_seconds, plot_timeline, read_timeline
from agentrl.records.checkpoints import CheckpointStore
from agentrl.records.judge_warning import judge_figures
from agentrl.records.run_folder import DEFAULT_BASE_PATH
from agentrl.records.runs import COMPARED, RunInfo, find_runs
from agentrl.records.step_record import unrecorded_steps
from agentrl.rl.ledger import REASONS


@app.command()
def runs(base_path: str = typer.Option(DEFAULT_BASE_PATH, help="root folder of runs")) -> None:
    """List runs with their latest step, best train and held-out reward, and path."""
    found = find_runs(base_path)
    if not found:
        typer.echo(f"no runs under {Path(base_path).resolve()}")
        return
    typer.echo(f"{'run':<32} {'step':>5} {'best train':>10} {'best val':>9}  path")
    for info in found:
        step = info.steps[-1] if info.steps else "-"
        typer.echo(
            f"{info.label:<32} {step!s:>5} {fmt(info.best('train')):>10} {fmt(info.best('val')):>9}  {info.path.resolve()}"
        )


@app.command()
def show(
    run: str = typer.Argument(..., help="PROJECT/NAME or a run folder"),
    against: str | None = typer.Option(None, help="another run (a what-if of this one): its steps side by side"),
    base_path: str = typer.Option(DEFAULT_BASE_PATH),
) -> None:
    """A run's reward per step and split, and where its transcripts and reward plot are."""
    info = resolve_run_option(run, base_path)
    if against is not None:
        echo_comparison(info, resolve_run_option(against, base_path))
        return
    typer.echo(f"run {info.label}: checkpoints {info.steps or 'none'}")
    if lost := unrecorded_steps(info.path):
        typer.echo(
            f"warning: checkpoints {lost} have no line in metrics.jsonl (a crash right after their commit): registering "
            "the model again (or resuming with `agentrl train`) writes their records again from the checkpoints",
            err=True,
        )
    judged = [judge_figures(m) for m in info.metrics]
    audited = any("judge_flip_rate" in j for j in judged)  # the judge audit's columns, when it ran
    judge_header = f" {'flips':>6} {'1st':>5} {'tau':>6}" if audited else ""
    typer.echo(
        f"{'step':>5} {'split':<6} {'reward':>8} {'std':>7} {'tokens':>7} {'seconds':>8} {'exact ctx':>9}{judge_header}"
    )
    for m, j in zip(info.metrics, judged):
        seconds = sum(v for k, v in m.items() if k.endswith("_s") and isinstance(v, float))
        judge = (
            f" {fmt(j.get('judge_flip_rate')):>6} {fmt(j.get('judge_first_position_rate')):>5} "
            f"{fmt(j.get('judge_independent_tau')):>6}"
            if audited
            else ""
        )
        typer.echo(
            f"{m['step']:>5} {m['split']:<6} {fmt(m.get('reward_mean')):>8} {fmt(m.get('reward_std')):>7} "
            f"{m.get('trained_tokens') or 0:>7.0f} {seconds:>8.1f} {context_cell(m):>9}{judge}"
        )
    if ledgers := [m for m in info.metrics if "tokens_sampled" in m]:
        typer.echo(ledger_line(ledgers))
    if counted := [m for m in info.metrics if "sampled_turns" in m]:
        typer.echo(context_line(counted))
    typer.echo(f"reward plot: {(info.path / 'reward.png').resolve()}")
    if audited:
        typer.echo(f"judge audit plot: {(info.path / 'judge.png').resolve()}")
    typer.echo(f"transcripts: {(info.path / 'transcripts').resolve()}")


@app.command()
def replay(
    run: str = typer.Argument(..., help="PROJECT/NAME or a run folder"),
    step: int = typer.Option(..., help="the step to train again (from checkpoint STEP-1 and its recorded input)"),
    base_path: str = typer.Option(DEFAULT_BASE_PATH),
) -> None:
    """Train a recorded step again and compare the result with its checkpoint, byte for byte."""
    from agentrl.backend.training.replay.replay import replay_step

    info = resolve_run_option(run, base_path)
    try:
        report = replay_step(info.path, step)
    except CheckpointError as error:
        raise typer.BadParameter(str(error)) from error
    typer.echo(f"step {step} of {info.label}, recorded: sha256 {report.recorded_sha256}")
    typer.echo(f"step {step} of {info.label}, replayed: sha256 {report.replayed_sha256}")
    for name, (recorded, here) in report.differing_conditions.items():
        typer.echo(f"  {name}: recorded {recorded}, here {here}")
    if report.identical:
        typer.echo("identical: the same adapter and optimizer state, byte for byte")
        return
    typer.echo(f"different: largest difference {report.largest_difference:.3g} in {report.largest_difference_in}")
    if not report.differing_conditions:  # same conditions, different bytes: something is not deterministic
        raise SystemExit(1)


@app.command()
def timeline(
    run: str = typer.Argument(..., help="PROJECT/NAME or a run folder"),
    start: float = typer.Option(0.0, help="where the drawing starts, in seconds from the run's first span"),
    seconds: float | None = typer.Option(None, help="how many seconds to draw (default: to the end)"),
    out: str | None = typer.Option(None, help="the PNG to write (default: timeline.png in the run folder)"),
    base_path: str = typer.Option(DEFAULT_BASE_PATH),
) -> None:
    """Draw a run's timeline.json as a PNG (open the JSON itself in ui.perfetto.dev to explore it) and say how
    busy each kind of track was over the whole run."""
    info = resolve_run_option(run, base_path)
    trace = info.path / TIMELINE_FILE
    if not trace.exists():
        raise typer.BadParameter(f"{trace} does not exist: a run records its timeline from its first step on")
    window_s, busy = busy_seconds(read_timeline(trace))
    shares = ", ".join(f"{category} {seconds / max(window_s, 1e-9):.0%}" for category, seconds in busy.items())
    typer.echo(f"busy over the {window_s:.0f} s recorded: {shares} (idle is the rest)")
    typer.echo(
        f"timeline plot: {plot_timeline(trace, Path(out) if out else info.path / 'timeline.png', start_s=start, seconds=seconds).resolve()}"
    )


def echo_comparison(info: RunInfo, other: RunInfo) -> None:
    """The train steps two runs share, metric by metric (`COMPARED` and the reward): this -> other."""
    mine, theirs = info.trained_steps(), other.trained_steps()
    common = sorted(set(mine) & set(theirs))
    if not common:
        raise typer.BadParameter(f"{info.label} and {other.label} share no trained step to compare")
    typer.echo(f"{info.label} -> {other.label}, the {len(common)} train steps both have")
    names = ("reward_mean", *COMPARED)
    typer.echo(f"{'step':>5} " + " ".join(f"{name:>29}" for name in names))
    for step in common:
        cells = [f"{general(mine[step].get(k)):>12} -> {general(theirs[step].get(k)):<12}" for k in names]
        typer.echo(f"{step:>5} " + " ".join(cells))


def ledger_line(steps: list[dict[str, Any]]) -> str:
    """The token ledger summed over steps: sampled = trained + each reason for a discard (see `rl.ledger`)."""
    total = {name: sum(m.get(name) or 0.0 for m in steps) for name in ("tokens_sampled", "tokens_trained")}
    discards = " + ".join(
        f"{sum(m.get(f'tokens_discarded_{r}') or 0.0 for m in steps):.0f} {r.replace('_', ' ')}" for r in REASONS
    )
    unaccounted = sum(m.get("tokens_unaccounted") or 0.0 for m in steps)
    line = f"token ledger, {len(steps)} steps: {total['tokens_sampled']:.0f} sampled = "
    return line + f"{total['tokens_trained']:.0f} trained + {discards} (unaccounted: {unaccounted:.0f})"


def context_cell(metrics: dict[str, Any]) -> str:
    """A train step's context-exact turns of its trained turns ("12/12"), "-" where the step recorded none."""
    if "sampled_turns" not in metrics:
        return "-"
    return f"{metrics.get('context_exact_turns', 0):.0f}/{metrics['sampled_turns']:.0f}"


def context_line(steps: list[dict[str, Any]]) -> str:
    """The run's trained turns scored in exactly the token context the engine sampled them from (see
    `agentrl.rl.engine_context`), and the steps that trained any turn in a re-rendered one."""
    turns = sum(m["sampled_turns"] for m in steps)
    exact = sum(m.get("context_exact_turns", 0) for m in steps)
    inexact = [m["step"] for m in steps if m.get("context_exact_turns", 0) < m["sampled_turns"]]
    line = f"context-exact turns, {len(steps)} steps: {exact:.0f} of {turns:.0f}"
    return line + (f"; re-rendered context in steps {inexact}" if inexact else "")


def general(value: float | None) -> str:
    """A metric of any size for a table: four significant digits, or "-" where none was recorded."""
    return "-" if value is None else f"{value:.4g}"


def parse_settings(settings: list[str]) -> dict[str, Any]:
    """`KEY=VALUE` pairs as TrainConfig changes: VALUE read as JSON (numbers, true, lists), else as text."""
    changes: dict[str, Any] = {}
    for setting in settings:
        key, equals, value = setting.partition("=")
        if not equals or not key:
            raise typer.BadParameter(f"--set {setting!r}: write KEY=VALUE, e.g. --set learning_rate=1e-4")
        try:
            changes[key] = json.loads(value)
        except json.JSONDecodeError:
            changes[key] = value
    return changes


SETTINGS_OPTION = typer.Option(None, "--set", help="KEY=VALUE: any other TrainConfig field changed (repeatable)")


@app.command()
def whatif(
    run: str = typer.Argument(..., help="PROJECT/NAME or a run folder"),
    first: int = typer.Option(..., "--from", help="the first step to train again (from checkpoint FROM-1)"),
    steps: int = typer.Option(1, help="how many recorded steps to train again"),
    loss: str | None = typer.Option(None, help="another policy loss (ppo, cispo, importance_sampling, dro, gspo)"),
    settings: list[str] | None = SETTINGS_OPTION,
    name: str | None = typer.Option(None, help="the new run's name (default: NAME-whatif-FROM)"),
    base_path: str = typer.Option(DEFAULT_BASE_PATH),
) -> None:
    """Train recorded steps again under another TrainConfig, without sampling or judging, into a new run."""
    from agentrl.backend.training.replay.whatif import what_if

    info = resolve_run_option(run, base_path)
    changes = parse_settings(settings or []) | ({"loss": loss} if loss else {})
    out_dir = info.path.parent / (name or f"{info.path.name}-whatif-{first}")
    try:
        check_safe_name(out_dir.name, "--name")
        results = what_if(info.path, first=first, steps=steps, changes=changes, out_dir=out_dir)
    except (CheckpointError, ConfigurationError) as error:
        raise typer.BadParameter(str(error)) from error
    typer.echo(f"{info.label} steps {first}-{first + steps - 1} again with {changes or 'no change'}: {out_dir}")
    typer.echo(f"{'step':>5} " + " ".join(f"{name + ' (was -> now)':>34}" for name in COMPARED) + "  same bytes")
    for result in results:
        cells = [f"{general(result.original.get(k)):>15} -> {general(result.changed.get(k)):<15}" for k in COMPARED]
        typer.echo(f"{result.step:>5} " + " ".join(cells) + f"  {'yes' if result.identical else 'no'}")


@app.command()
def serve(
    run: str = typer.Argument(..., help="PROJECT/NAME or a run folder"),
    step: int | None = typer.Option(None, help="checkpoint step (default: the latest)"),
    base_path: str = typer.Option(DEFAULT_BASE_PATH),
) -> None:
    """Serve a checkpoint as an OpenAI-compatible endpoint (model name NAME@STEP) until Ctrl-C."""
    from agentrl.foundation.base_models import cache_dir

    info = resolve_run_option(run, base_path)
    if not info.steps:
        raise typer.BadParameter(f"run {info.label} has no checkpoint yet")
    step = info.steps[-1] if step is None else step
    if step not in info.steps:
        raise typer.BadParameter(f"run {info.label} has no checkpoint for step {step}; it has {info.steps}")
    checkpoint = CheckpointStore(info.path).path(step)
    # Serving only reads the run: its log goes to the cache, never into the run folder.
    log_path = cache_dir() / "serve-logs" / f"{info.path.parent.name}-{info.path.name}-{step:04d}.log"

    async def serve_forever() -> None:
        server = base_model_server(info, step, log_path)
        await server.start()
        name = served_name(info.path.name, step)
        await server.load_adapter(name, checkpoint)
        typer.echo(
            f"serving {name} at {server.base_url} (OpenAI-compatible; api key {server.api_key}; log {log_path}; "
            "Ctrl-C stops it)"
        )
        try:
            while server.process is not None and server.process.poll() is None:
                await asyncio.sleep(1)
        finally:
            server.stop()

    try:
        asyncio.run(serve_forever())
    except KeyboardInterrupt:
        pass
