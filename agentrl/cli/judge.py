"""`agentrl judge check|examples|train`: measure a judge before its scores become rewards, and train one."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from agentrl.cli.app import app, base_model_server, resolve_run_option
from agentrl.foundation.errors import ConfigurationError
from agentrl.foundation.sampled_record import served_name
from agentrl.records.checkpoints import CheckpointStore
from agentrl.records.run_folder import DEFAULT_BASE_PATH
from agentrl.records.runs import RunInfo

if TYPE_CHECKING:
    from agentrl.data.trajectory_group import TrajectoryGroup
    from agentrl.judges.check import JudgeCheckReport


judge_app = typer.Typer(no_args_is_help=True, help="Check an LLM judge before its scores become rewards; train one.")
app.add_typer(judge_app, name="judge")
BASE_JUDGE = "base"
READOUT_OPTION = typer.Option(
    "probabilities",
    help="how the judge's decisions are read: probabilities (one token per pair of attempts, both orders, where "
    "the judge returns logprobs; else JSON) or json (RULER's sampled scores and explanations)",
)
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
    max_tokens: int = typer.Option(
        1024, help="the judge's max_tokens per JSON answer (readout json, or a judge without logprobs)"
    ),
    readout: str = READOUT_OPTION,
    base_path: str = typer.Option(DEFAULT_BASE_PATH, help="root folder of runs"),
) -> None:
    """Judge a run's recorded groups with RULER as recorded, shuffled and repeated: agreement with the
    verifiable reward (pairwise accuracy, Kendall's tau, 95% intervals), order sensitivity, position
    bias, repeatability and cost. Writes judge_checks/{time}.json and .html in the run folder."""
    from agentrl.judges.check_report import recorded_groups, table, write_check

    judge = judge or [BASE_JUDGE]
    info = resolve_run_option(run, base_path)
    try:
        groups, per_step = recorded_groups(info.path, split=split, max_groups=max_groups)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from error
    from agentrl.judges.readout import READOUTS
    from agentrl.judges.trained import RUN_PREFIX, check_same_readout, trained_judge_run

    if readout not in READOUTS:
        raise typer.BadParameter(f"--readout must be one of: {', '.join(READOUTS)}")
    if any(j == BASE_JUDGE or j.startswith(RUN_PREFIX) for j in judge) and not info.steps:
        raise typer.BadParameter(f"run {info.label} has no checkpoint to read its base model from; pass --judge MODEL")
    for spec in [j for j in judge if j.startswith(RUN_PREFIX)]:
        try:  # before any server starts: a judge that is not there, or answers another way, is named now
            check_same_readout(trained_judge_run(spec, base_path)[0], readout)
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
            readout=readout,
        )
    )
    typer.echo(table(reports))
    json_path, html_path = write_check(info.path, reports)
    typer.echo(f"saved {json_path}\npage  {html_path}")


async def _check_judges(
    info: RunInfo, groups: list[TrajectoryGroup], judges: list[str], per_step: int, base_path: str, **settings: Any
) -> list[JudgeCheckReport]:
    """One report per judge; 'base' starts the run's base model on a local vLLM server for the check,
    and `run:NAME` loads a trained judge's adapter on it."""
    from agentrl.judges.check import check_judge
    from agentrl.judges.trained import RUN_PREFIX, check_same_base_model, trained_judge_run

    server = None
    try:
        reports = []
        for name in judges:
            judge: Any = name
            if name == BASE_JUDGE or name.startswith(RUN_PREFIX):
                from agentrl.client.model import Model
                from agentrl.foundation.base_models import cache_dir

                if server is None:
                    server = base_model_server(info, info.steps[-1], cache_dir() / "judge-check.log")
                    await server.start()
                served = "base"
                if name.startswith(RUN_PREFIX):  # a trained judge: its adapter, on the run's base model
                    judge_info, adapter = trained_judge_run(name, base_path)
                    base = CheckpointStore(info.path).adapter_config(info.steps[-1])
                    check_same_base_model(judge_info, adapter, str(base["base_model_name_or_path"]))
                    served = served_name(judge_info.path.name, judge_info.steps[-1])
                    await server.load_adapter(served, CheckpointStore(judge_info.path).path(judge_info.steps[-1]))
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
                    readout=settings["readout"],
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
    base_path: str = typer.Option(DEFAULT_BASE_PATH, help="root folder of runs"),
) -> None:
    """Write labelled judge examples from a run's recorded groups: each group whose attempts scored
    differently on the verifiable reward (`independent_reward` where a judge replaced it), for `judge train`."""
    from agentrl.judges.check_report import recorded_groups
    from agentrl.judges.examples import examples_from_groups, write_examples
    from agentrl.judges.ruler import DEFAULT_RUBRIC

    info = resolve_run_option(run, base_path)
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
    examples: str = typer.Option(
        ...,
        help="JSONL of labelled examples: judge examples (agentrl.judges.examples.JudgeExample) for --kind ruler, "
        "verdict examples (agentrl.judges.VerdictExample) for --kind rubric",
    ),
    kind: str = typer.Option(
        "ruler", help="ruler (rank a group: --reward ruler) or rubric (one rubric's Yes or No: --reward rubric)"
    ),
    held_out: str | None = typer.Option(None, help="JSONL of held-out examples: the judge is checked before and after"),
    project: str = typer.Option("judges", help="the judge run's project"),
    base_model: str = typer.Option(
        "smollm2-135m-instruct", help="the policy's base model (a judge is served beside it)"
    ),
    epochs: int = typer.Option(2, min=0, help="SFT epochs (0: no SFT)"),
    learning_rate: float = typer.Option(2e-3, help="SFT learning rate"),
    orders: int | None = typer.Option(
        None, min=1, help="orders each example is shown in during SFT (readout json; default 2)"
    ),
    rl_steps: int = typer.Option(0, min=0, help="then GRPO steps rewarded by agreement with the labels"),
    rl_learning_rate: float = typer.Option(1e-4, help="learning rate of the RL steps"),
    max_tokens: int | None = typer.Option(
        None, help="the judge's max_tokens per answer, RL and the check (readout json; default 256)"
    ),
    readout: str = READOUT_OPTION,
    base_path: str = typer.Option(DEFAULT_BASE_PATH, help="root folder of runs"),
) -> None:
    """Train a RULER judge (or, with --kind rubric, a rubric judge) on labelled examples (SFT, then optionally
    RL on agreement), on a local backend, checking it on held-out examples before and after; judge with it by
    `--judge run:NAME`."""
    from agentrl.judges.examples import load_examples, load_verdict_examples

    _check_train_options(kind, readout, rl_steps, orders=orders, max_tokens=max_tokens)
    for path in [examples, held_out]:
        if path is not None and not Path(path).is_file():
            raise typer.BadParameter(f"no examples file at {path} (JSONL, one example a line)")
    load = load_verdict_examples if kind == "rubric" else load_examples
    try:
        train_examples: list[Any] = load(examples)
        check_examples: list[Any] = load(held_out) if held_out is not None else []
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
                readout=readout,
                kind=kind,
            )
        )
    except ConfigurationError as error:
        raise typer.BadParameter(str(error)) from error


def _check_train_options(kind: str, readout: str, rl_steps: int, **json_settings: int | None) -> None:
    """`judge train`'s options that cannot go together, refused with the fix."""
    from agentrl.judges.readout import READOUTS, refuse_json_settings

    if readout not in READOUTS:
        raise typer.BadParameter(f"--readout must be one of: {', '.join(READOUTS)}")
    if kind not in ("ruler", "rubric"):
        raise typer.BadParameter(f"--kind must be ruler or rubric, got {kind!r}")
    if kind == "rubric" and (readout != "probabilities" or rl_steps):
        raise typer.BadParameter(
            "a rubric judge is trained by SFT on its one-token verdict and read from probabilities: "
            "leave --readout and --rl-steps unset with --kind rubric"
        )
    try:
        refuse_json_settings(readout, **{f"--{k.replace('_', '-')}": v for k, v in json_settings.items()})
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
    from agentrl.judge_training import train_judge, train_judge_rl, train_verdict_judge, verdict_accuracy
    from agentrl.judges.check import check_judge
    from agentrl.judges.trained import JUDGE_PROJECT, RUN_PREFIX

    judge = agentrl.TrainableModel(name=name, project=project, base_model=base_model, base_path=base_path)
    backend = agentrl.LocalBackend()
    check: dict[str, Any] = {
        "permutations": 1,
        "repeats": 0,
        "extra_litellm_params": {"max_tokens": settings["max_tokens"] or 256, "temperature": 0.0},
        "readout": settings["readout"],
    }

    async def held_out(when: str) -> None:
        if check_examples and settings["kind"] == "rubric":
            found = await verdict_accuracy(judge, check_examples)
            typer.echo(
                f"held-out {when} (step {await judge.get_step()}): verdict accuracy {found['accuracy']:.2f} over "
                f"{found['n']:.0f} (passing {found['accuracy_passing']:.2f}, failing {found['accuracy_failing']:.2f}; "
                f"mean P(Yes) {found['p_yes_passing']:.2f} passing, {found['p_yes_failing']:.2f} failing)"
            )
        elif check_examples:
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
            result = (
                await train_verdict_judge(judge, train_examples, config)
                if settings["kind"] == "rubric"
                else await train_judge(
                    judge, train_examples, config, orders=settings["orders"], readout=settings["readout"]
                )
            )
            typer.echo(f"SFT -> step {result.step}, loss {result.metrics.get('sft_loss', float('nan')):.4f}")
        if settings["rl_steps"]:
            results = await train_judge_rl(
                judge,
                train_examples,
                agentrl.TrainConfig(learning_rate=settings["rl_learning_rate"]),
                steps=settings["rl_steps"],
                max_tokens=settings["max_tokens"],
                readout=settings["readout"],
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
        f"judge run: {judge.run_dir.resolve()}\njudge with it: agentrl train ... --reward {settings['kind']} "
        f"--judge {RUN_PREFIX}{spec}"
        + (f" --judge-readout {settings['readout']}" if settings["readout"] != "probabilities" else "")
    )
