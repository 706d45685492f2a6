"""ART's `art.utils.s3`: a run folder to and from object storage by project and model name, on agentrl's storage
code (`agentrl.art.storage`: keys checked, nothing written outside the run folder, no local file overwritten).

`s3_bucket` is a bucket (`"my-bucket"`, `"s3://my-bucket"`, through boto3) or a local folder, as for
`LocalBackend._experimental_push_to_s3`; None reads `BACKUP_BUCKET`. ART shells out to the AWS CLI for
`s3_sync` and presigns archives for deployment: those two raise, naming what to call instead.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from agentrl.foundation.distribution import install_extra
from agentrl.foundation.errors import ConfigurationError

from ..state import art_model_dir
from ..storage import pull_from_s3, push_to_s3

__all__ = [
    "archive_and_presign_step_url",
    "build_s3_path",
    "ensure_bucket_exists",
    "pull_model_from_s3",
    "push_model_to_s3",
    "s3_sync",
]


def _run(model_name: str, project: str, art_path: str | None) -> Any:
    """What the storage functions take of a model: its run folder (ART's layout), project and name."""
    return SimpleNamespace(run_dir=art_model_dir(art_path or ".art", project, model_name), project=project,
                           name=model_name)  # fmt: skip


def build_s3_path(
    *, model_name: str, project: str, step: int | None = None, s3_bucket: str | None = None, prefix: str | None = None
) -> str:
    """s3://{bucket}/{prefix/}{project}/models/{name}[/checkpoints/{step:04d}], as ART builds it."""
    bucket = (s3_bucket or os.environ.get("BACKUP_BUCKET") or "").removeprefix("s3://").strip("/")
    if not bucket:
        raise ConfigurationError("name the bucket: s3_bucket='my-bucket' (or set BACKUP_BUCKET, as ART reads)")
    path = f"s3://{bucket}/{prefix.strip('/') + '/' if prefix else ''}{project}/models/{model_name}"
    return path + (f"/checkpoints/{step:04d}" if step is not None else "")


async def pull_model_from_s3(
    model_name: str,
    project: str,
    step: int | None = None,
    s3_bucket: str | None = None,
    prefix: str | None = None,
    verbose: bool = False,
    delete: bool = False,
    art_path: str | None = None,
    exclude: list[str] | None = None,
) -> str:
    """Pull a stored run (one `step`'s checkpoint, or all) into {art_path}/{project}/models/{name}; returns that folder."""
    run = _run(model_name, project, art_path)
    await asyncio.to_thread(pull_from_s3, run, s3_bucket=s3_bucket, prefix=prefix, only_step=step, exclude=exclude,
                            verbose=verbose, delete=delete)  # fmt: skip
    return str(run.run_dir)


async def push_model_to_s3(
    model_name: str,
    project: str,
    s3_bucket: str | None = None,
    prefix: str | None = None,
    verbose: bool = False,
    delete: bool = False,
    art_path: str | None = None,
) -> None:
    """Push {art_path}/{project}/models/{name} (complete checkpoints, records) to storage."""
    run = _run(model_name, project, art_path)
    await asyncio.to_thread(push_to_s3, run, s3_bucket=s3_bucket, prefix=prefix, verbose=verbose, delete=delete)


async def ensure_bucket_exists(s3_bucket: str | None = None, profile: str | None = None) -> None:
    """Create the bucket (or folder) if it does not exist yet."""
    bucket = s3_bucket or os.environ.get("BACKUP_BUCKET")
    if not bucket:
        raise ConfigurationError("name the bucket: s3_bucket='my-bucket' (or set BACKUP_BUCKET, as ART reads)")
    if bucket.startswith(("file://", "/", ".")):
        Path(bucket.removeprefix("file://")).mkdir(parents=True, exist_ok=True)
        return
    try:
        import boto3
    except ImportError as error:
        raise ConfigurationError(f"s3:// storage needs boto3: {install_extra('s3')}") from error
    client = (boto3.Session(profile_name=profile) if profile else boto3).client("s3")
    name = bucket.removeprefix("s3://").strip("/")
    existing = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
    if name not in existing:
        await asyncio.to_thread(client.create_bucket, Bucket=name)


async def s3_sync(*args: Any, **kwargs: Any) -> None:
    """ART runs `aws s3 sync` here; agentrl copies runs itself."""
    raise ConfigurationError(
        "art.utils.s3.s3_sync (the AWS CLI) has no counterpart: use push_model_to_s3 / pull_model_from_s3"
    )


async def archive_and_presign_step_url(*args: Any, **kwargs: Any) -> str:
    """ART archives a checkpoint and presigns its URL for a deployment; agentrl does not deploy."""
    raise ConfigurationError(
        "art.utils.s3.archive_and_presign_step_url (for deployments) has no counterpart: agentrl does not deploy; "
        "serve a checkpoint with `agentrl serve`"
    )
