#!/usr/bin/env bash
# vLLM's engine decoding, the overlay's tpu-inference against the pin's
# unpatched one (the installed package with the whole series reverse-applied),
# one engine process after the other on the same devices and model: decode
# tokens/s at batch 1, 8 and 64 (greedy, the same prompts), whether the
# tokens are equal, and overlay/upstream per batch in the last lines.
# Usage: scripts/bench-decode.sh [PYTHON] [OPTIONS]
#   PYTHON (or $MRL_BENCH_PYTHON) is the python of an environment with the
#   overlay installed (default: build/test-matrix/cells/py312/venv/bin/python).
#   OPTIONS (tests/bench/bench_decode.py --help): --cpu-simulation (8 CPU
#   devices, kernels interpreted), --tokens N (64), --batches 1,8,64,
#   --repeats R (3), --model small|medium|smoke, --json FILE, --keep DIR.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/scripts/lib.sh"
run_bench "$root" decode yes "$@"
