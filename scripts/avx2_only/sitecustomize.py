"""Loaded by scripts/avx2_only.sh through PYTHONPATH, in every Python process the command starts.

Makes a CPU with AVX-512 and native bf16 answer as an AVX2-only one: torch.cpu's AVX-512 and AMX probes
(vLLM then loads its `_C_AVX2` kernels) and agentrl's `cpu_has_native_bf16` (agentrl then samples and
trains in float32) say no. The script caps oneDNN, ATen and MKL at AVX2 through their own variables.
"""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any


def _no(*_: Any) -> bool:
    return False


_ANSWER_NO: dict[str, tuple[str, ...]] = {
    "torch.cpu": (  # each probe torch 2.13 has beyond AVX2's
        "_is_avx512_supported",
        "_is_avx512_bf16_supported",
        "_is_vnni_supported",
        "_is_amx_tile_supported",
        "_is_amx_fp16_supported",
    ),
    "agentrl.backend.precision": ("cpu_has_native_bf16",),
}


class _AnswerNo(importlib.abc.MetaPathFinder):
    """Finds the modules above through the other finders and sets their probes to `_no` once they have run."""

    def find_spec(self, name: str, path: Sequence[str] | None, target: ModuleType | None = None) -> ModuleSpec | None:
        if name not in _ANSWER_NO:
            return None
        for finder in sys.meta_path:
            spec = None if finder is self else finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                break
        else:
            return None
        exec_module: Callable[[ModuleType], None] = spec.loader.exec_module

        def exec_and_answer_no(module: ModuleType) -> None:
            exec_module(module)
            for probe in _ANSWER_NO[name]:
                setattr(module, probe, _no)

        spec.loader.exec_module = exec_and_answer_no  # type: ignore[method-assign]
        return spec


sys.meta_path.insert(0, _AnswerNo())
