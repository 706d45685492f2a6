"""scripts/avx2_only.sh: a command run through it sees a CPU without AVX-512 or native bf16, whatever this CPU has."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")

REPO = Path(__file__).resolve().parents[3]
PROBE = """
import json, torch, torch.cpu
from vllm.platforms import current_platform
from agentrl.backend.precision import bf16_is_native
from agentrl.backend.serving.server import server_dtype
current_platform.import_kernels()
from vllm import _custom_ops as ops
kernels = [line.split()[-1].rsplit("/", 1)[1] for line in open("/proc/self/maps") if "/vllm/_C" in line]
try:  # oneDNN at AVX2 has no bf16 matmul
    ops.create_onednn_mm(torch.zeros(8, 8, dtype=torch.bfloat16), 32)
    onednn_bf16 = True
except RuntimeError:
    onednn_bf16 = False
beyond_avx2 = [n for n in dir(torch.cpu) if n.startswith("_is_") and n != "_is_avx2_supported" and getattr(torch.cpu, n)()]
print(json.dumps({"avx512": torch.cpu._is_avx512_supported(), "beyond_avx2": beyond_avx2, "bf16": bf16_is_native("cpu"),
                  "serves_in": server_dtype("auto", gpu=False), "kernels": sorted(set(kernels)),
                  "aten": torch.backends.cpu.get_cpu_capability(), "onednn_bf16": onednn_bf16}))
"""


def test_a_command_run_as_on_an_avx2_only_cpu_computes_in_float32_with_vllms_avx2_kernels():
    done = subprocess.run(
        ["bash", str(REPO / "scripts/avx2_only.sh"), sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {
        "avx512": False,
        "beyond_avx2": [],  # every probe torch.cpu has for more than AVX2
        "bf16": False,
        "serves_in": "float32",
        "kernels": ["_C_AVX2.abi3.so"],
        "aten": "AVX2",
        "onednn_bf16": False,
    }
