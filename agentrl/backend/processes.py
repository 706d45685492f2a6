"""Helpers for the processes a backend starts (vLLM servers, trainer ranks): a free port, shares of the
CPU cores, and a child that dies with its parent."""

from __future__ import annotations

import signal
import socket
import sys


def free_port(host: str = "127.0.0.1") -> int:
    """A free TCP port on the interface of `host` (loopback by default)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def split_contiguous(items: list[int], parts: int) -> list[list[int]]:
    """`items` in `parts` contiguous runs whose lengths differ by at most one."""
    size, extra = divmod(len(items), parts)
    runs, start = [], 0
    for index in range(parts):
        end = start + size + (index < extra)
        runs.append(items[start:end])
        start = end
    return runs


def die_with_parent() -> None:
    """In the child, before exec: get SIGTERM when the parent dies, even by SIGKILL (Linux only).

    The signal follows the thread that started the child, so start the server from a long-lived
    thread (the event loop's), never from a short-lived worker thread.
    """
    if sys.platform == "linux":
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
