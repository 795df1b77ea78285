#!/usr/bin/env bash
# The wheel test matrix. Usage: scripts/test-matrix.sh [--platform cpu|tpu] [--wheels DIR] [--quick]
# Without --wheels it first builds them: from the pins where the upstream
# repositories are reachable (MRL_SOURCES="NAME=PATH ..." or the network), and
# otherwise, with --standins, from the PyPI releases in tests/standins.toml.
# MRL_WORK sets the work folder (default build/test-matrix); MRL_KEEP=1 keeps the venvs.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
platform=cpu wheels="" quick="" standins=""
while [ $# -gt 0 ]; do
  case "$1" in
    --platform) platform=$2; shift 2 ;;
    --wheels) wheels=$2; shift 2 ;;
    --quick) quick=--quick; shift ;;
    --standins) standins=1; shift ;;
    *) echo "usage: scripts/test-matrix.sh [--platform cpu|tpu] [--wheels DIR] [--quick] [--standins]" >&2; exit 2 ;;
  esac
done
work=${MRL_WORK:-$root/build/test-matrix}
if [ -z "$wheels" ]; then
  wheels=$work/dist
  args=()
  if [ -n "$standins" ]; then
    while IFS= read -r s; do args+=(--source "$s"); done < <("$root/.venv/bin/python" "$root/tests/standins.py")
    args+=(--unpinned --only google-tunix,tpu-inference)
  else
    only=""
    for s in ${MRL_SOURCES:-}; do args+=(--source "$s"); only+="${only:+,}${s%%=*}"; done
    # Build what sources were given for (the vLLM pin needs GitHub); all without.
    [ -z "$only" ] || args+=(--only "$only")
  fi
  "$root/scripts/build-wheels.sh" "${args[@]}" --out "$wheels" --constraints "$work/constraints.txt"
fi
exec "$root/scripts/overlay-tool.sh" test-matrix --platform "$platform" --wheels "$wheels" --work "$work/cells" $quick ${MRL_KEEP:+--keep}
