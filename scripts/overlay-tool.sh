#!/usr/bin/env bash
# Run the maxtext-rl-overlay tool from this checkout, in the tool venv
# (.venv, Python 3.12) that scripts/setup.sh makes.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
[ -x "$root/.venv/bin/python" ] || { echo "no tool venv at $root/.venv: run scripts/setup.sh first" >&2; exit 2; }
export UV_PYTHON_DOWNLOADS=never
exec "$root/.venv/bin/python" -m maxtext_rl_overlay "$@"
