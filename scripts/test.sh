#!/usr/bin/env bash
# The test command: ruff and mypy, the tool's tests (fast checks, the build pipeline and the rebase command on
# real upstream code), then the quick wheel matrix on the 8-device CPU mesh.
# Tests that need a TPU or the upstream git repositories say so when skipped.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
. scripts/lib.sh
use_tool_venv "$root"
# Lint and types first: seconds, and a finding fails the run like a test.
ruff check overlay tests
mypy
python -m pytest tests/unit tests/pipeline tests/rebase -p no:cacheprovider "$@"
scripts/test-matrix.sh --platform cpu --quick --standins
