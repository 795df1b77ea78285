#!/usr/bin/env bash
# gather_logprobs and sample() on a vocab-sharded mesh, in the engine's
# configuration (the runner's Auto mesh, its logits sharding: overlay, patch
# 0006, vs upstream) and, for gather_logprobs, under Explicit axes (patch
# 0002's shard-local top-k vs 0001's reshard), vs one device; times and
# collective bytes.
# Usage: scripts/bench-logprobs.sh [PYTHON] [--platform auto|cpu|tpu] [--one-device]
#   PYTHON (or $MRL_BENCH_PYTHON) is the python of a venv with the overlay wheels
#   installed, e.g. the one `MRL_KEEP=1 scripts/test-matrix.sh` keeps:
#   <MRL_WORK>/cells/py312/venv/bin/python (default: build/test-matrix/cells/py312/venv/bin/python).
# BENCH_RUNS sets the number of timed runs (default 15; BENCH_SAMPLE_RUNS those
# of sample(), default 3). Runs in one process: on the CPU an 8-device CPU
# simulation; on a one-chip TPU host (found by its device files, or
# --platform tpu) the one-device cases: overlay's plain path and patch 0006's
# path forced with one vocab shard, each against upstream (--one-device
# rehearses those on one CPU device). The first line says where it ran; the
# last lines give ratios measured in that run (tests/bench/bench_logprobs.py
# says which).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/scripts/lib.sh"
run_bench "$root" logprobs no "$@"
