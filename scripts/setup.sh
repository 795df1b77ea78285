#!/usr/bin/env bash
# Make the tool venv (.venv, Python 3.12) with maxtext-rl-overlay installed
# editable and its build and test tools (uv, patch-ng, pytest). Needs only a
# Python 3.12 and the package index: uv is installed into the venv itself.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/scripts/lib.sh"
py=$(find_python312)
[ -x "$root/.venv/bin/python" ] || "$py" -m venv "$root/.venv"
[ -x "$root/.venv/bin/uv" ] || "$root/.venv/bin/python" -m pip install --quiet --disable-pip-version-check "uv>=0.13"
export UV_PYTHON_DOWNLOADS=never
"$root/.venv/bin/uv" pip install --quiet -p "$root/.venv/bin/python" -e "$root[build,test]"
echo "tool venv ready: $root/.venv ($("$root/.venv/bin/python" --version))" >&2
