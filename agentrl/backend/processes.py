"""Helpers for the processes a backend starts (vLLM servers, trainer ranks): a free port, shares of the
CPU cores, and a child that dies with its parent."""

from __future__ import annotations

import socket

from agentrl_vllm.zygote import die_with_parent as die_with_parent  # one copy: vLLM's side needs it too


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
