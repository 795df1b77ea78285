#!/usr/bin/env bash
# Warm overlay build vs plain uv build --wheel of the same sources; prints figures.
# Usage: scripts/bench-build.sh NAME=PATH [NAME=PATH ...]   (as build-wheels' --source)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/scripts/lib.sh"
use_tool_venv "$root"
PYTHONPATH="$root/tests${PYTHONPATH:+:$PYTHONPATH}" exec python "$root/tests/bench/bench_build.py" "$@"
