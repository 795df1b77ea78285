#!/usr/bin/env bash
# The wheel test matrix. Usage: scripts/test-matrix.sh [--platform cpu|tpu] [--wheels DIR] [--quick]
# Without --wheels it first builds them: the upstreams MRL_SOURCES names
# ("NAME=PATH ..."; a clone or mirror holding the pin; when it is unset, the
# repositories in ../shared/upstream) from their pins, the rest from the
# network (git) with the CPU torch of the PyTorch index; with --standins, the
# rest from the PyPI releases in tests/standins.toml and torch from PyPI, all
# labelled as stand-ins (CI has neither GitHub nor that index).
# MRL_WORK sets the work folder (default build/test-matrix); MRL_KEEP=1 keeps the venvs.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
platform=cpu wheels="" quick="" standins=""
usage() {
  [ $# -eq 0 ] || echo "scripts/test-matrix.sh: $*" >&2
  echo "usage: scripts/test-matrix.sh [--platform cpu|tpu] [--wheels DIR] [--quick] [--standins]" >&2
  exit 2
}
while [ $# -gt 0 ]; do
  case "$1" in
    --platform|--wheels) [ $# -ge 2 ] && [ -n "$2" ] || usage "$1 needs a value" ;;
  esac
  case "$1" in
    --platform) platform=$2; shift 2 ;;
    --wheels) wheels=$2; shift 2 ;;
    --quick) quick=--quick; shift ;;
    --standins) standins=1; shift ;;
    *) usage "unknown argument '$1'" ;;
  esac
done
work=${MRL_WORK:-$root/build/test-matrix}
if [ -z "$wheels" ]; then
  wheels=$work/dist
  args=() named=""
  . "$root/scripts/lib.sh"
  for s in $(upstream_sources "$root"); do
    args+=(--source "$s"); named+=" ${s%%=*} "
    echo "scripts/test-matrix.sh: ${s%%=*} from its pinned commit in ${s#*=}" >&2
  done
  if [ -n "$standins" ]; then
    while IFS== read -r name path; do
      case "$named" in
        *" $name "*) ;;
        *) args+=(--source "$name=$path"); echo "scripts/test-matrix.sh: $name from its PyPI STAND-IN $(basename "$path") (no source of its pin here)" >&2 ;;
      esac
    done < <("$root/.venv/bin/python" "$root/tests/standins.py")
    args+=(--unpinned --torch-standin)
  fi
  if ! "$root/scripts/build-wheels.sh" "${args[@]}" --out "$wheels" --constraints "$work/constraints.txt"; then
    # The build's own hint names its --source flag; this script takes the sources from MRL_SOURCES.
    echo "scripts/test-matrix.sh: building the wheels failed. Give the upstreams' sources as" \
         "MRL_SOURCES=\"NAME=PATH ...\" (a clone or mirror holding the pin), or pass --standins;" \
         "or test wheels built already with --wheels DIR." >&2
    exit 1
  fi
fi
exec "$root/scripts/overlay-tool.sh" test-matrix --platform "$platform" --wheels "$wheels" --work "$work/cells" $quick ${MRL_KEEP:+--keep}
