"""One process per run folder: an OS lock (flock) on `{run}/.lock`, released when the process ends.

Two writers on one run would interleave checkpoint saves (one sweeping the other's staging folder
mid-save) and metrics lines. The lock file holds the holder's PID so the refused process can say
who has it. flock is released by the kernel when its holder dies, even by SIGKILL: no stale locks.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from agentrl.foundation.errors import ConfigurationError, RunLockedError
from agentrl.foundation.files import make_private_dir

LOCK_FILE = ".lock"


class RunLock:
    """An exclusive, non-blocking lock on a run folder, held from `acquire` to `release`."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock, or raise `RunLockedError` naming the process that holds it (held already: nothing to do)."""
        if self._fd is not None:
            return
        make_private_dir(self.path.parent)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RunLockedError(
                f"the run folder {self.path.parent} is in use by process {holder} (it holds {self.path}); "
                "one process trains or evaluates a run at a time. Stop that process, wait for it to finish, or use "
                "another run name"
            ) from None
        except OSError as error:  # ENOLCK, EOPNOTSUPP: a file system without locks (some NFS mounts)
            os.close(fd)
            raise ConfigurationError(
                f"cannot lock the run folder {self.path.parent}: its file system does not support file locks "
                f"({error.strerror}). Put runs (base_path) on a local disk"
            ) from error
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Give the lock up (the file stays; it is empty of meaning without the flock)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
