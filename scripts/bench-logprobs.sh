#!/usr/bin/env bash
# gather_logprobs and sample() on a vocab-sharded mesh, in the engine's
# configuration (the runner's Auto mesh, its logits sharding: overlay, patch
# 0006, vs upstream) and, for gather_logprobs, under Explicit axes (patch
# 0002's shard-local top-k vs 0001's reshard), vs one device; times and
# collective bytes.
# Usage: scripts/bench-logprobs.sh [PYTHON]
#   PYTHON (or $MRL_BENCH_PYTHON) is the python of a venv with the overlay wheels
#   installed, e.g. the one `MRL_KEEP=1 scripts/test-matrix.sh` keeps:
#   <MRL_WORK>/cells/py312/venv/bin/python (default: build/test-matrix/cells/py312/venv/bin/python).
# BENCH_RUNS sets the number of timed runs (default 15; BENCH_SAMPLE_RUNS those
# of sample(), default 3). Runs in one process on an 8-device CPU simulation;
# the last lines give ratios measured in that run (tests/bench/bench_logprobs.py
# says which).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=${1:-${MRL_BENCH_PYTHON:-$root/build/test-matrix/cells/py312/venv/bin/python}}
[ -x "$python" ] || { echo "bench-logprobs: no python at $python (give a venv's python)" >&2; exit 2; }
# The suite's helpers (tests/support) are imported as pytest imports them.
PYTHONPATH="$root/tests${PYTHONPATH:+:$PYTHONPATH}" exec "$python" "$root/tests/bench/bench_logprobs.py"
