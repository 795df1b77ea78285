#!/usr/bin/env bash
# The hardware gate of the TPU workflows: install an index folder's wheels
# into a fresh venv with the README's own command and run
# `maxtext-rl-overlay smoke` there, keeping its JSON. With --maxtext the
# install is the README's MaxText one (maxtext-rl-overlay[maxtext], with the
# index's torch stand-in overrides where it has them), and smoke runs MaxText's
# configuration too (train_rl's maxtext_on_vllm).
# Usage: scripts/smoke-wheels.sh --wheels DIR --json FILE [--cpu-simulation] [--maxtext]
# (A release built with --base-url names a URL that does not serve these
# wheels yet: they are installed from the folder itself.)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
wheels="" json="" simulation="" maxtext=""
usage() {
  [ $# -eq 0 ] || echo "scripts/smoke-wheels.sh: $*" >&2
  echo "usage: scripts/smoke-wheels.sh --wheels DIR --json FILE [--cpu-simulation] [--maxtext]" >&2
  exit 2
}
while [ $# -gt 0 ]; do
  case "$1" in
    --wheels|--json) [ $# -ge 2 ] && [ -n "$2" ] || usage "$1 needs a value" ;;
  esac
  case "$1" in
    --wheels) wheels=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    --cpu-simulation) simulation=--cpu-simulation; shift ;;
    --maxtext) maxtext=1; shift ;;
    *) usage "unknown argument '$1'" ;;
  esac
done
[ -n "$wheels" ] && [ -n "$json" ] || usage "--wheels and --json are required"
[ -f "$wheels/constraints.txt" ] || { echo "scripts/smoke-wheels.sh: $wheels has no constraints.txt: give the index folder the build made" >&2; exit 3; }
. "$root/scripts/lib.sh"
use_tool_venv "$root"
work=$(mktemp -d "${TMPDIR:-/tmp}/mrl-smoke-wheels.XXXXXX")
trap 'rm -rf "$work"' EXIT
constraints=$(python -c 'import pathlib, sys; from maxtext_rl_overlay import publish; print(publish.local_view(pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])))' "$wheels" "$work/index")
uv venv -q -p "$(find_python312)" "$work/venv"
install=(-c "$constraints" maxtext-rl-overlay)
if [ -n "$maxtext" ]; then
  overrides=$(dirname "$constraints")/torch-standin-overrides.txt
  install=(-c "$constraints")
  [ -f "$overrides" ] && install+=(--override "$overrides")
  install+=("maxtext-rl-overlay[maxtext]")
fi
echo "scripts/smoke-wheels.sh: uv pip install ${install[*]} (the README's command)" >&2
uv pip install -q -p "$work/venv/bin/python" "${install[@]}"
mkdir -p "$(dirname "$json")"
# Its status is the script's (0 passed, 1 a check failed, 3 cannot run here).
status=0
"$work/venv/bin/maxtext-rl-overlay" smoke --json "$json" $simulation || status=$?
exit "$status"
