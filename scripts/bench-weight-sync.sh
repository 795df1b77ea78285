#!/usr/bin/env bash
# Weight sync (Tunix transfer_state_directly) of a scanned llama3-shaped state of
# 32 and 80 layers, rng state included: the overlay vs upstream under MaxText's
# shim vs the param-only path; times and peak resident memory, as ratios.
# Usage: scripts/bench-weight-sync.sh [PYTHON]
#   PYTHON (or $MRL_BENCH_PYTHON) is the python of the matrix's MaxText cell venv
#   (maxtext 0.2.4 + the overlay wheels), e.g. the one `MRL_KEEP=1 scripts/test-matrix.sh`
#   keeps (default: build/test-matrix/cells/maxtext-0.2.4/venv/bin/python).
# BENCH_RUNS sets the number of timed runs (default 5). One process, 8-device CPU
# simulation; the last line of each size is
#   L=<n> overlay_vs_shim time=<x> peak=<y>; overlay_vs_param_only time=<x> peak=<y>
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=${1:-${MRL_BENCH_PYTHON:-$root/build/test-matrix/cells/maxtext-0.2.4/venv/bin/python}}
[ -x "$python" ] || { echo "bench-weight-sync: no python at $python (give a venv's python)" >&2; exit 2; }
# Arrays of 64 KiB and more are mmapped and given back when freed, so the
# resident set follows the live arrays and VmHWM measures each sync's peak.
# The suite's helpers (tests/support) are imported as pytest imports them.
MALLOC_MMAP_THRESHOLD_=65536 PYTHONPATH="$root/tests${PYTHONPATH:+:$PYTHONPATH}" exec "$python" "$root/tests/bench/bench_weight_sync.py"
