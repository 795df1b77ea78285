#!/usr/bin/env bash
# Run the maxtext-rl-overlay tool from this checkout, in the tool venv
# (.venv, Python 3.12) that scripts/setup.sh makes.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/scripts/lib.sh"
use_tool_venv "$root"
exec python -m maxtext_rl_overlay "$@"
