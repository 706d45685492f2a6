#!/usr/bin/env bash
# Build the documentation site strictly (a broken link or a missing reference fails) and serve it.
# Usage: bash scripts/docs.sh [build]   (build: only build it, into ./site)
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/mkdocs ] || bash scripts/setup.sh --dev  # the docs extra comes with --dev
export NO_MKDOCS_2_WARNING=1
if [ "${1:-}" = "build" ]; then
    exec .venv/bin/mkdocs build --strict
fi
exec .venv/bin/mkdocs serve --strict --dev-addr 127.0.0.1:8000
