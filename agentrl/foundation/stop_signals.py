"""Long-running commands stop on Ctrl-C and SIGTERM, whatever signal dispositions they inherited.

A shell starts a background job (`nohup cmd &`) with SIGINT ignored; Python then never installs its
KeyboardInterrupt handler, and a command that stops only on KeyboardInterrupt runs on, with its
vLLM server, until killed (seen here: 25 minutes after the SIGINT). So every entry point calls
`handle_stop_signals()` first: both signals become KeyboardInterrupt, the `finally` blocks run,
and the server's process group is ended.
"""

from __future__ import annotations

import signal
from types import FrameType


def _as_sigint(signum: int, frame: FrameType | None) -> None:
    # Re-sent as SIGINT, SIGTERM takes Ctrl-C's path: under asyncio.run that cancels the main task
    # (its `finally` blocks run in order); a KeyboardInterrupt raised here instead could land inside
    # any task, a server's included, and skip the cleanup.
    signal.raise_signal(signal.SIGINT)


def handle_stop_signals() -> None:
    """Make SIGINT and SIGTERM raise KeyboardInterrupt in the main thread (call from the main thread)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also lets asyncio.run cancel its main task
    signal.signal(signal.SIGTERM, _as_sigint)
