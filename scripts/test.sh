#!/usr/bin/env bash
# The test command: ruff and mypy, the tool's tests (fast checks, the build pipeline and the rebase command on
# real upstream code), then the quick wheel matrix on the 8-device CPU mesh.
# The upstreams come from their pinned commits wherever a source is at hand:
# MRL_SOURCES when set, else the repositories in ../shared/upstream; the PyPI
# stand-ins only where neither names one. Tests that need a TPU, or upstream
# history no source here holds, say so when skipped.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
. scripts/lib.sh
use_tool_venv "$root"
MRL_SOURCES=$(upstream_sources "$root")
export MRL_SOURCES
echo "scripts/test.sh: upstream sources: ${MRL_SOURCES:-none (the PyPI stand-ins)}" >&2
# Lint and types first: seconds, and a finding fails the run like a test.
ruff check overlay tests scripts
mypy
mypy tests/fixes/tpu-inference/conftest.py  # a second `conftest` module: pyproject's [tool.mypy] says why
python -m pytest tests/unit tests/pipeline tests/rebase -p no:cacheprovider "$@"
scripts/test-matrix.sh --platform cpu --quick --standins
