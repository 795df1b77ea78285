#!/usr/bin/env bash
# Make the tool venv (.venv, Python 3.12) with maxtext-rl-overlay installed
# editable and its build and test tools (uv, patch-ng, pytest).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/scripts/lib.sh"
py=$(find_python312)
command -v uv >/dev/null 2>&1 || { echo "installing uv" >&2; "$py" -m pip install --quiet uv; }
export UV_PYTHON_DOWNLOADS=never
uv venv --quiet --seed --allow-existing -p "$py" "$root/.venv"
uv pip install --quiet -p "$root/.venv/bin/python" -e "$root[build,test]"
echo "tool venv ready: $root/.venv ($("$root/.venv/bin/python" --version))" >&2
