"""Run folders to and from object storage (ART's `_experimental_push_to_s3`, `_experimental_pull_from_s3`,
`_experimental_fork_checkpoint`).

A destination is an S3 bucket (`"my-bucket"` or `"s3://my-bucket"`, through boto3: the `s3` extra;
`AWS_ENDPOINT_URL` points it at any S3-compatible server) or a local folder (`"/backups"`,
`"file:///backups"`). A run lives at `{bucket}/{prefix/}{project}/models/{name}/` (ART's layout, the
same as the run folder's under its base path), its files as in the run folder. Pulling never overwrites a file the run folder already has, and a checkpoint arrives whole:
it is downloaded into a staging folder and renamed into place, as the trainer writes them.

A stored key is never trusted as a path: a pull takes only keys whose parts are plain names (no empty,
`.` or `..` part, no absolute key, no backslash), step folders of digits holding only the files a
checkpoint has (`CHECKPOINT_FILES`), and writes only where the resolved target stays inside the run
folder. Symbolic links are never followed, neither in a source folder nor in the run folder. A key that
breaks these rules fails the whole pull with a `ConfigurationError` naming it, before anything is written.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from agentrl.foundation.distribution import install_extra
from agentrl.foundation.errors import ConfigurationError
from agentrl.records.checkpoints import CHECKPOINT_FILES, INFO_FILE, CheckpointStore

from .state import run_name_of

logger = logging.getLogger(__name__)

# What ART's `exclude` names, as run-folder paths.
EXCLUDABLE = {"checkpoints": ("checkpoints/",), "trajectories": ("trajectories/",),
              "logs": ("logs/", "metrics.jsonl", "transcripts/", "reward.png")}  # fmt: skip
_NEVER_COPIED = (".lock", ".staging-", ".corrupt-")
_STEP_FOLDER = re.compile(r"[0-9]+")


class _Location:
    """A bucket or a folder, holding files by key ("project/name/checkpoints/0003/adapter.safetensors")."""

    def __init__(self, bucket: str | None) -> None:
        bucket = bucket or os.environ.get("BACKUP_BUCKET")
        if not bucket:
            raise ConfigurationError("name the bucket: s3_bucket='my-bucket' (or set BACKUP_BUCKET, as ART reads)")
        self.folder: Path | None = None
        if bucket.startswith("file://") or bucket.startswith("/") or bucket.startswith("."):
            self.folder = Path(bucket.removeprefix("file://"))
            self.name = str(self.folder)
            return
        self.name = bucket.removeprefix("s3://").strip("/")
        try:
            import boto3
        except ImportError as error:
            raise ConfigurationError(f"s3:// storage needs boto3: {install_extra('s3')}") from error
        self.client = boto3.client("s3")

    def keys(self, prefix: str) -> Iterator[str]:
        if self.folder is not None:
            root = self.folder / prefix
            if root.exists():
                yield from (p.relative_to(self.folder).as_posix() for p in sorted(root.rglob("*")) if _plain_file(p))
            return
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.name, Prefix=prefix):
            yield from (item["Key"] for item in page.get("Contents", []))

    def put(self, source: Path, key: str) -> None:
        if self.folder is None:
            self.client.upload_file(str(source), self.name, key)
            return
        target = self.folder / key
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.with_name(f".{target.name}.{uuid.uuid4().hex}")
        shutil.copyfile(source, temporary)
        os.replace(temporary, target)

    def get(self, key: str, target: Path) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.with_name(f".{target.name}.{uuid.uuid4().hex}")
        try:
            if self.folder is None:
                self.client.download_file(self.name, key, str(temporary))
            else:
                _copy_without_links(_inside(self.folder, self.folder / key), temporary)
            os.replace(temporary, target)
        finally:
            temporary.unlink(missing_ok=True)


def _plain_file(path: Path) -> bool:
    """A regular file reached without a symbolic link (a link could name any file of the machine)."""
    return path.is_file() and not path.is_symlink()


def _copy_without_links(source: Path, target: Path) -> None:
    """Copy a regular file, refusing a source that is (or has become) a symbolic link."""
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as error:
        raise ConfigurationError(
            f"{source} is not a plain file (a symbolic link?): a pull never follows links"
        ) from error
    with os.fdopen(fd, "rb") as reader, open(target, "xb") as writer:
        shutil.copyfileobj(reader, writer)


def _checked_relative(key: str, relative: str) -> tuple[str, ...]:
    """The parts of a stored key's run-relative path, or a ConfigurationError naming the key when it could
    reach outside the run folder (an empty, `.` or `..` part, an absolute key, a backslash) or names a
    checkpoint folder or file a checkpoint never has."""
    parts = tuple(relative.split("/"))
    if relative.startswith("/") or "\\" in relative or "\0" in relative or any(p in ("", ".", "..") for p in parts):
        raise ConfigurationError(
            f"the stored key {key!r} is not a plain path under its run (an empty, '.' or '..' part, an absolute "
            "path or a backslash): nothing was pulled. Remove the key from the bucket or pull from a bucket you trust"
        )
    if parts[0] == "checkpoints" and len(parts) > 1 and not parts[1].startswith(_NEVER_COPIED):
        if len(parts) != 3 or not _STEP_FOLDER.fullmatch(parts[1]) or parts[2] not in CHECKPOINT_FILES:
            raise ConfigurationError(
                f"the stored key {key!r} is not a checkpoint file (checkpoints/<digits>/<one of "
                f"{sorted(CHECKPOINT_FILES)}>): nothing was pulled. Remove the key or pull from a bucket you trust"
            )
    return parts


def _inside(folder: Path, target: Path) -> Path:
    """`target` if, with every link resolved, it stays inside `folder`; else a ConfigurationError."""
    root = folder.resolve()
    resolved = target.resolve()
    if resolved != root and root not in resolved.parents:
        raise ConfigurationError(
            f"{target} resolves to {resolved}, outside {root} (a symbolic link?): a pull never reads or writes "
            "outside the stored run and the run folder"
        )
    return target


def _run_prefix(prefix: str | None, project: str, name: str) -> str:
    return "/".join(p.strip("/") for p in (prefix or "", project, "models", name) if p and p.strip("/")) + "/"


def _excluded(relative: str, exclude: Iterable[str]) -> bool:
    for what in exclude:
        if what not in EXCLUDABLE:
            raise ConfigurationError(f"exclude={what!r}: ART's choices are {sorted(EXCLUDABLE)}")
        if any(relative == p or relative.startswith(p) for p in EXCLUDABLE[what]):
            return True
    return False


def push_to_s3(
    model: Any, *, s3_bucket: str | None = None, prefix: str | None = None, verbose: bool = False, delete: bool = False
) -> str:
    """Upload the model's run folder (complete checkpoints, metrics, trajectories); returns where it went."""
    location = _Location(s3_bucket)
    run_dir = Path(model.run_dir)
    if not run_dir.exists():
        raise ConfigurationError(f"{run_dir} does not exist: train or register the model before pushing it")
    if delete:
        raise ConfigurationError("push(delete=True) is not supported: agentrl never deletes remote copies")
    run_prefix = _run_prefix(prefix, model.project, run_name_of(model))
    for path in sorted(run_dir.rglob("*")):
        relative = path.relative_to(run_dir).as_posix()
        if _plain_file(path) and not any(part.startswith(_NEVER_COPIED) for part in relative.split("/")):
            location.put(path, run_prefix + relative)
            if verbose:
                logger.info("pushed %s", relative)
    return f"{location.name}/{run_prefix}"


def pull_from_s3(
    model: Any,
    *,
    s3_bucket: str | None = None,
    prefix: str | None = None,
    only_step: int | str | None = None,
    exclude: Iterable[str] | None = None,
    latest_only: bool = False,
    verbose: bool = False,
    delete: bool = False,
) -> int | None:
    """Download a run folder into the model's; returns the latest checkpoint step it now has (None: none).

    With `delete` (ART's: the folder mirrors the stored run), the run folder's files the stored run does not hold
    are moved aside into `{run}/.deleted-{id}/` rather than deleted, so nothing a user had is lost."""
    location = _Location(s3_bucket)
    run_prefix = _run_prefix(prefix, model.project, run_name_of(model))
    run_dir = Path(model.run_dir)
    latest = _copy_run(location, run_prefix, run_dir, only_step="latest" if latest_only else only_step,
                       exclude=list(exclude or []), verbose=verbose)  # fmt: skip
    if delete:
        by_step, others = _stored_run(location, run_prefix, run_dir, list(exclude or []))
        stored = {*others, *(f for files in by_step.values() for f in files)}
        _move_aside_unstored(run_dir, stored, list(exclude or []))
        latest = CheckpointStore(run_dir).latest_step()
    return latest


def _move_aside_unstored(run_dir: Path, stored: set[str], exclude: list[str]) -> None:
    """Move the run folder's files that are not in `stored` (nor excluded, nor agentrl's own) into `.deleted-{id}/`."""
    if not run_dir.exists():
        return
    aside = run_dir / f".deleted-{uuid.uuid4().hex[:8]}"
    for path in sorted(run_dir.rglob("*")):
        relative = path.relative_to(run_dir).as_posix()
        if not _plain_file(path) or relative in stored or _excluded(relative, exclude):
            continue
        if any(part.startswith((*_NEVER_COPIED, ".deleted-")) for part in relative.split("/")):
            continue
        target = aside / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        os.rename(path, target)
        logger.warning("pull(delete=True): %s is not in the stored run; moved aside to %s", relative, target)
    for folder in sorted((p for p in run_dir.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        if not any(folder.iterdir()) and not folder.name.startswith(".deleted-"):
            folder.rmdir()  # an emptied checkpoint folder is no checkpoint


def _copy_run(
    location: _Location,
    run_prefix: str,
    run_dir: Path,
    *,
    only_step: int | str | None,
    exclude: list[str],
    verbose: bool,
) -> int | None:
    by_step, others = _stored_run(location, run_prefix, run_dir, exclude)
    complete = sorted(s for s, files in by_step.items() if f"checkpoints/{s:04d}/{INFO_FILE}" in files)
    if only_step is not None:
        wanted = complete[-1:] if only_step == "latest" else [int(only_step)]
        if only_step != "latest" and int(only_step) not in complete:
            raise ConfigurationError(f"only_step={only_step}: the stored run has checkpoints {complete}")
        complete = wanted
    store = CheckpointStore(run_dir)
    for step in complete:
        _pull_checkpoint(location, run_prefix, store, step, by_step[step], run_dir)
        if verbose:
            logger.info("pulled checkpoint %d", step)
    for relative in others:
        target = _inside(run_dir, run_dir / relative)
        if target.exists() or target.is_symlink():
            logger.warning("kept the local %s (a pull never overwrites a file the run folder has)", target)
            continue
        location.get(run_prefix + relative, target)
    return store.latest_step()


def _stored_run(
    location: _Location, run_prefix: str, run_dir: Path, exclude: list[str]
) -> tuple[dict[int, list[str]], list[str]]:
    """The stored run's checkpoint files by step and its other files, as run-relative paths, every key checked
    (`_checked_relative`, and its target inside `run_dir`) before anything is written."""
    by_step: dict[int, list[str]] = {}
    others: list[str] = []
    for key in location.keys(run_prefix):
        relative = key[len(run_prefix) :]
        if not relative or _excluded(relative, exclude):
            continue
        parts = _checked_relative(key, relative)
        if any(part.startswith(_NEVER_COPIED) for part in parts):
            continue  # a lock, a staging or a set-aside folder: never part of a run's copy
        _inside(run_dir, run_dir / relative)
        if parts[0] == "checkpoints" and len(parts) == 3:
            by_step.setdefault(int(parts[1]), []).append(relative)
        else:
            others.append(relative)
    return by_step, others


def _pull_checkpoint(
    location: _Location, run_prefix: str, store: CheckpointStore, step: int, files: list[str], run_dir: Path
) -> None:
    """Download one checkpoint into a staging folder and rename it into place; a local one is never overwritten."""
    if store.path(step).exists():
        return  # the local checkpoint is the one this run served
    staging = _inside(run_dir, store.root / f".staging-{step:04d}-{uuid.uuid4().hex[:8]}")
    try:
        for relative in files:
            location.get(run_prefix + relative, staging / relative.split("/", 2)[2])
        os.rename(staging, _inside(run_dir, store.path(step)))
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def fork_checkpoint(
    model: Any,
    *,
    from_model: str,
    from_project: str,
    from_s3_bucket: str | None,
    not_after_step: int | None,
    prefix: str | None,
    base_path: Path,
    verbose: bool = False,
) -> int:
    """Copy another run's checkpoint into this model's (empty) run as its latest; returns the step copied."""
    store = CheckpointStore(Path(model.run_dir))
    if store.steps():
        raise ConfigurationError(f"{model.run_dir} already has checkpoints {store.steps()}: fork into a new model name")
    if from_s3_bucket is not None:
        location = _Location(from_s3_bucket)
        source_prefix = _run_prefix(prefix, from_project, from_model)
    else:
        location = _Location(str(base_path.resolve()))
        source_prefix = _run_prefix(None, from_project, from_model)
    steps = sorted({int(k[len(source_prefix):].split("/")[1]) for k in location.keys(source_prefix + "checkpoints/")
                    if k.endswith("/" + INFO_FILE)})  # fmt: skip
    eligible = [s for s in steps if not_after_step is None or s <= not_after_step]
    if not eligible:
        raise ConfigurationError(
            f"no checkpoint of {from_project}/{from_model} in {location.name}"
            + (f" at or before step {not_after_step}" if not_after_step is not None else "")
            + f" (it has {steps})"
        )
    step = eligible[-1]
    _copy_run(location, source_prefix, Path(model.run_dir), only_step=step, exclude=["logs", "trajectories"],
              verbose=verbose)  # fmt: skip
    return step
