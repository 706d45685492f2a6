"""Files that survive crashes and full disks: atomic rewrites, fsynced folders, whole-line appends.

Checkpoints, run tracking, W&B's run id and the benchmark tables all write through these, so a
crash leaves either the old file or the new one, and an appended log never a half line.
"""

from __future__ import annotations

import errno
import itertools
import json
import logging
import math
import os
import re
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agentrl.foundation.errors import ConfigurationError

__all__ = ["append_line", "check_safe_name", "read_lines", "write_json_atomic", "write_text_atomic"]
"""What environments and scripts may use: atomic writes, JSON-lines records, safe path components."""

logger = logging.getLogger(__name__)


SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
"""What may name a folder or a file part that comes from a caller: a run's project and name, a split."""


def check_safe_name(value: str, what: str) -> str:
    """`value` if it is safe as one path component (`SAFE_NAME`, no '..'); else a ConfigurationError naming it."""
    if not isinstance(value, str) or not SAFE_NAME.fullmatch(value) or ".." in value:
        raise ConfigurationError(
            f"{what} {value!r} must be 1-100 letters, digits, '.', '_' or '-', starting with a letter or digit, "
            "without '..', '/' or '@' (it becomes part of a file or folder name in the run folder)"
        )
    return value


def make_private_dir(path: Path) -> None:
    """Create `path` and its missing parents readable by this user only (0700): runs hold trajectories,
    checkpoints and tokens. Folders that already exist keep their modes."""
    missing = []
    for folder in [Path(path), *Path(path).parents]:
        if folder.exists():
            break
        missing.append(folder)
    for folder in reversed(missing):
        folder.mkdir(mode=0o700, exist_ok=True)


def write_text_atomic(path: Path, text: str, *, mode: int = 0o600) -> None:
    """Write through a temporary file (flushed to disk) and a rename, then flush the folder, so a crash or a
    power loss never leaves half a file, and a failure (a full disk) leaves no temporary file behind.

    `mode` (less the umask) is set when the file is created, so a secret is never readable by others.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_path(path.parent)


def write_text_new(paths: Iterator[Path], text: str) -> Path:
    """Write `text` under the first of `paths` that does not exist yet, never replacing a file; returns it.

    The text goes to a temporary file (flushed) that is then hard-linked to the name, which fails when the
    name exists, so two writers never take the same one and a reader never sees half a file."""
    first = next(paths)
    first.parent.mkdir(parents=True, exist_ok=True)
    tmp = first.with_name(f".{first.name}.{uuid.uuid4().hex}.tmp")
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    try:
        for path in itertools.chain([first], paths):
            if _claim(tmp, path):
                fsync_path(path.parent)
                return path
        raise FileExistsError(f"every name for {first} is taken")
    finally:
        tmp.unlink(missing_ok=True)


def _claim(tmp: Path, path: Path) -> bool:
    """Give `tmp`'s text the name `path` if that name is free (False if taken): a hard link, or where the file system
    has none (some network and FUSE mounts), an exclusive create and a copy. Neither ever replaces a file."""
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    except OSError as error:
        if error.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
            raise
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "wb") as out:
        out.write(tmp.read_bytes())
        out.flush()
        os.fsync(out.fileno())
    return True


def fsync_tree(folder: Path) -> None:
    """Flush every file under `folder`, then each folder itself (its entries), to disk."""
    for path in sorted(folder.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        fsync_path(path)
    fsync_path(folder)


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def gunzip_bounded(data: bytes, limit: int, what: str) -> bytes:
    """`data` gunzipped, refusing (ConfigurationError) to inflate past `limit` bytes: a small file that inflates
    without bound (a gzip bomb, or a damaged one) never takes the process's memory."""
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(data, limit + 1)
    except zlib.error as error:
        raise ConfigurationError(f"{what} is not valid gzip: {error}") from error
    if len(out) > limit or inflater.unconsumed_tail:
        raise ConfigurationError(f"{what} inflates past {limit} bytes, the most agentrl reads from one such file")
    if not inflater.eof:
        raise ConfigurationError(f"{what} ends before its gzip stream does (a torn file)")
    return out


def write_json_atomic(path: Path, data: Any) -> None:
    """`write_text_atomic` for JSON."""
    write_text_atomic(path, json.dumps(data, indent=2))


def _finite_or_none(value: Any) -> Any:
    """JSON has no NaN or Infinity: a non-finite number is written as null (strict readers choke on `NaN`)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite_or_none(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite_or_none(v) for v in value]
    return value


def append_line(path: Path, record: dict[str, Any]) -> None:
    """Append one JSON line whole, or not at all, and flush it to disk before returning.

    One `write` of the whole line to a file opened for appending; if it fails part-way (a full
    disk), the file is cut back to where it was. A line torn by a crash before this code existed
    is ended with a newline first, so it never swallows the next record. The line is fsynced (a
    record appended beside an fsynced checkpoint must survive a power loss as the checkpoint does).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (json.dumps(_finite_or_none(record), allow_nan=False) + "\n").encode()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data
        try:
            written = os.write(fd, data)
            if written != len(data):
                raise OSError(errno.ENOSPC, f"only {written} of {len(data)} bytes of a line reached {path}")
        except OSError:
            os.ftruncate(fd, size)
            raise
        os.fsync(fd)
    finally:
        os.close(fd)


def read_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of an appended file; an unreadable (torn) line is skipped with a warning."""
    records = []
    for number, line in enumerate(Path(path).read_text(errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as error:
            logger.warning("skipping line %d of %s, which is torn or not JSON (%s): %.80r", number, path, error, line)
    return records
