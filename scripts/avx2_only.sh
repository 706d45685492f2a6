#!/usr/bin/env bash
# Run a command as on a CPU without AVX-512 or native bf16 (AVX2 only, where agentrl computes in float32),
# on a CPU that has them: to check that the code and the tests hold on such a machine (vLLM's AVX2 kernels,
# oneDNN without bf16, the float32 paths), not to time it. Measured on a 2-core AMD EPYC with AVX512-BF16
# (2026-11-28): the server decoded 313 / 388 tokens/s at 32 / 64 sequences this way, against 149 / 192 on
# a real AVX2-only EPYC, so times taken this way are not a float32 machine's.
# Usage: bash scripts/avx2_only.sh .venv/bin/python -m pytest -q -m "not slow" -n 2
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export PYTHONPATH="$here/avx2_only${PYTHONPATH:+:$PYTHONPATH}"
# torch.compile's cache keys leave out these caps: a kernel cached by a native run and loaded here (or the
# other way round) counted 450 where 884 was right (vLLM's compiled logprob-rank count), so keep apart.
export TORCHINDUCTOR_CACHE_DIR="${TMPDIR:-/tmp}/torchinductor_$(id -un)_avx2_only"
export ONEDNN_MAX_CPU_ISA=AVX2 DNNL_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2
# Benchmarks name the machine of a run made this way as such (benchmarks.step_breakdown.cpu_name).
export AGENTRL_AVX2_ONLY=1
exec "$@"
