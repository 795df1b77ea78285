#!/usr/bin/env bash
# The test command: ruff and mypy, then the tool's tests (fast checks, the build pipeline and the rebase command on
# real upstream code) beside the quick wheel matrix on the 8-device CPU mesh.
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
# The quick matrix and the tool's suites run side by side: the matrix is
# CPU-bound (XLA compiling on 8 simulated devices, engines), the suites wait
# mostly on their children (uv, git, a local index), so on a small machine
# the two together take little more than the matrix alone. The matrix's
# lines carry "[matrix] " and are kept whole in build/test-logs/matrix.log.
mkdir -p build/test-logs
set -m  # the matrix in a process group of its own, so that it can be stopped whole
{ scripts/test-matrix.sh --platform cpu --quick --standins 2>&1 | tee build/test-logs/matrix.log | sed -u 's/^/[matrix] /'
  exit "${PIPESTATUS[0]}"; } &
matrix=$!
set +m
trap 'kill -TERM -- "-$matrix" 2>/dev/null || true' EXIT
status=0
python -m pytest tests/unit tests/pipeline tests/rebase -p no:cacheprovider "$@" || status=$?
echo "scripts/test.sh: the tool's suites: status $status; waiting for the quick matrix" >&2
wait "$matrix" || { m=$?; echo "scripts/test.sh: the quick matrix failed (status $m): build/test-logs/matrix.log" >&2; status=1; }
trap - EXIT
exit "$status"
