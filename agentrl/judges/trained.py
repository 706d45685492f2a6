"""A trained judge as a reward: the run `--judge run:NAME` names, checked against the policy (one base model, the
readout and kind it was trained for), as a `TrainableModel` to serve beside the policy; and the record in its run
folder of how it was trained to answer (`agentrl.judge_training` writes it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

from agentrl.foundation.errors import ConfigurationError
from agentrl.foundation.files import write_text_atomic
from agentrl.judges.readout import Readout, check_readout

if TYPE_CHECKING:
    from agentrl.client.model import TrainableModel
    from agentrl.records.runs import RunInfo

JUDGE_PROJECT = "judges"
"""Where `agentrl judge train` keeps judge runs ({base_path}/judges/NAME)."""
RUN_PREFIX = "run:"
"""`--judge run:NAME` (or run:PROJECT/NAME): a judge trained with agentrl."""
READOUT_RECORD = "judge.json"
"""In a judge's run folder: how it was trained to answer ({"readout": ..., "kind": ...}), so it is read the same way."""
JudgeKind = Literal["ruler", "rubric"]
"""What a trained judge learned: RULER's task (ranking a group, `--reward ruler`) or a rubric judge's
(one rubric's Yes or No about one response, `--reward rubric`; `agentrl.judge_training.verdicts`)."""


def record_readout(judge: TrainableModel, readout: Readout, kind: JudgeKind = "ruler") -> None:
    """Note in the judge's run folder how it is trained to answer and what it judges; a judge trained two ways
    is refused."""
    path = judge.run_dir / READOUT_RECORD
    before = (recorded_readout(judge.run_dir), recorded_kind(judge.run_dir)) if path.exists() else (readout, kind)
    if before != (readout, kind):
        raise ConfigurationError(
            f"judge {judge.project}/{judge.name} was trained as a {before[1]} judge answering with readout="
            f"{before[0]!r}; train it on that way, or train a new judge (another name) as a {kind} judge with "
            f"readout={readout!r}"
        )
    write_text_atomic(path, json.dumps({"readout": readout, "kind": kind}) + "\n")


def recorded_readout(run_path: Path) -> Readout:
    """How the judge in `run_path` was trained to answer ("json" for judges from before agentrl recorded it)."""
    path = run_path / READOUT_RECORD
    return check_readout(json.loads(path.read_text())["readout"]) if path.exists() else "json"


def recorded_kind(run_path: Path) -> JudgeKind:
    """What the judge in `run_path` learned to judge ("ruler" for judges from before agentrl recorded it)."""
    path = run_path / READOUT_RECORD
    kind = json.loads(path.read_text()).get("kind", "ruler") if path.exists() else "ruler"
    return cast(JudgeKind, kind)


def trained_judge_run(spec: str, base_path: str | Path) -> tuple[RunInfo, dict[str, Any]]:
    """The run `run:NAME` (run:PROJECT/NAME, or run:FOLDER) names and its latest checkpoint's adapter
    config; `ConfigurationError` when there is no such run or it was never trained."""
    from agentrl.records.checkpoints import CheckpointStore
    from agentrl.records.runs import resolve_run

    project, _, name = spec.removeprefix(RUN_PREFIX).rpartition("/")
    info = resolve_run(f"{project or JUDGE_PROJECT}/{name}", base_path)
    if not info.steps or info.steps[-1] == 0:
        raise ConfigurationError(
            f"judge run {info.label} has no trained checkpoint (steps {info.steps or 'none'}); "
            f"train it first: agentrl judge train {name} --examples FILE"
        )
    adapter = CheckpointStore(info.path).adapter_config(info.steps[-1])
    return info, adapter


def check_same_base_model(info: RunInfo, adapter: dict[str, Any], base_model: str) -> None:
    """A judge adapter is served beside the policy, so both must sit on one base model (an adapter
    that does not record its base model, from before agentrl recorded it, is taken on trust)."""
    recorded = adapter.get("base_model_name_or_path")
    trained_on = Path(str(recorded)).name
    if recorded and trained_on != Path(base_model).name:
        raise ConfigurationError(
            f"judge run {info.label} was trained on base model {trained_on!r}; the policy's is {base_model!r}. "
            "A judge is served beside the policy on one base model: train the judge on the policy's"
        )


def check_same_readout(info: RunInfo, readout: Readout) -> None:
    """A judge is read the way it was trained to answer; ConfigurationError naming both ways otherwise."""
    trained = recorded_readout(info.path)
    if trained != readout:
        raise ConfigurationError(
            f"judge run {info.label} was trained to answer with readout {trained!r}, and is asked to judge with "
            f"{readout!r}: judge with its own (--judge-readout {trained}), or train a judge with --readout {readout}"
        )


def check_same_kind(info: RunInfo, kind: JudgeKind) -> None:
    """A judge judges the task it learned; ConfigurationError naming the reward that fits it otherwise."""
    trained = recorded_kind(info.path)
    if trained != kind:
        raise ConfigurationError(
            f"judge run {info.label} was trained as a {trained} judge and is asked to judge as a {kind} judge: "
            f"use it with --reward {trained}, or train a {kind} judge (agentrl judge train NAME --kind {kind})"
        )


def trained_judge(
    spec: str, *, base_path: str | Path, base_model: str, readout: Readout | None = None, kind: JudgeKind = "ruler"
) -> TrainableModel:
    """The judge `--judge run:NAME` names (run:PROJECT/NAME; project "judges" by default): its run as a
    `TrainableModel` with the adapter's own shape. Register it on the policy's backend, where it is
    served at its latest checkpoint; nothing trains it there, so its judgements stay those it was checked at.
    Given `readout`, a judge trained to answer another way is refused (`check_same_readout`), and one trained
    for another `kind` of judgement always (`check_same_kind`)."""
    from agentrl.client.model import TrainableModel
    from agentrl.foundation.config import LoRAConfig

    info, adapter = trained_judge_run(spec, base_path)
    check_same_base_model(info, adapter, base_model)
    if readout is not None:
        check_same_readout(info, readout)
    check_same_kind(info, kind)
    lora = LoRAConfig(
        rank=int(adapter["r"]),
        alpha=int(adapter["lora_alpha"]),
        dropout=float(adapter.get("lora_dropout") or 0.0),
        target_modules=tuple(sorted(adapter["target_modules"])),
    )
    return TrainableModel(
        name=info.path.name,
        project=info.path.parent.name,
        base_path=str(info.path.parent.parent),
        base_model=base_model,
        lora=lora,
    )
