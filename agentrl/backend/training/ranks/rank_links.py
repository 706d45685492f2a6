"""How the driver knows a trainer rank still lives: a rank it spawned lives while its process does; a rank
that joined from another host has no process here, so it lives while its connection is open and, during a
call, while it has been heard from within `silence_s` (it beats every `rank_hosts.HEARTBEAT_S`)."""

from __future__ import annotations

import time
from typing import Any

SILENCE_S = 60.0
"""How long the head waits, during a call, without a word from a remote rank before it calls that host gone."""


class LocalRank:
    """A rank in a process this backend spawned: alive while the process is."""

    def __init__(self, process: Any) -> None:
        self.process = process

    def heard(self) -> None:
        """A local rank's liveness is its process, not what it says."""

    def alive(self) -> bool:
        return bool(self.process.is_alive())

    def death(self, rank: int, method: str) -> str:
        how = "closed its pipe" if self.process.exitcode is None else f"died with exit code {self.process.exitcode}"
        return f"trainer rank {rank} (pid {self.process.pid}) {how} during {method}"

    def settle(self, seconds: float) -> None:
        """Give a dying process a moment to exit, so its exit code can be told."""
        self.process.join(seconds)

    def stop(self) -> None:
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)


class RemoteRank:
    """The head's view of a rank on another host: alive while its connection is open and, during a
    call, while it has been heard from within `silence_s`."""

    def __init__(self, host: str, pid: int, silence_s: float = SILENCE_S) -> None:
        self.host, self.pid, self.silence_s = host, pid, silence_s
        self.last_heard = time.monotonic()

    def heard(self) -> None:
        self.last_heard = time.monotonic()

    def alive(self) -> bool:
        return time.monotonic() - self.last_heard < self.silence_s

    def death(self, rank: int, method: str) -> str:
        if not self.alive():
            return (
                f"trainer rank {rank} on host {self.host} (pid {self.pid}) sent nothing for {self.silence_s:.0f} s "
                f"during {method}: the host or the network to it is gone"
            )
        return f"trainer rank {rank} on host {self.host} (pid {self.pid}) closed its connection during {method}"

    def settle(self, seconds: float) -> None:
        """Nothing to wait for: the process is on another host."""

    def stop(self) -> None:
        """Nothing to kill from here: closing its connection makes the rank's session end."""
