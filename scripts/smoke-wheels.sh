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
# Exit status: 0 every check passed, 1 a check failed (smoke's), 2 a wrong
# command line, 3 it could not run: no index folder, the venv or the install
# failed (said so, uv's own message above it), or smoke cannot run here.
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
constraints=$(python -c 'import pathlib, sys; from maxtext_rl_overlay.stages import indexpages; print(indexpages.local_view(pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])))' "$wheels" "$work/index")
# A venv or an install that fails is status 3 ("cannot run here"), never
# uv's own 1, which would read as "a check failed".
cannot() { echo "scripts/smoke-wheels.sh: $1 (uv exited $2), so the smoke did not run: see uv's message above" >&2; exit 3; }
uv venv -q -p "$(find_python312)" "$work/venv" || cannot "making the venv $work/venv failed" $?
install=(-c "$constraints" maxtext-rl-overlay)
if [ -n "$maxtext" ]; then
  overrides=$(dirname "$constraints")/torch-standin-overrides.txt
  install=(-c "$constraints")
  [ -f "$overrides" ] && install+=(--override "$overrides")
  install+=("maxtext-rl-overlay[maxtext]")
fi
echo "scripts/smoke-wheels.sh: uv pip install ${install[*]} (the README's command)" >&2
uv pip install -q -p "$work/venv/bin/python" "${install[@]}" || cannot "installing ${install[*]} from $wheels failed" $?
mkdir -p "$(dirname "$json")"
# Its status is the script's (0 passed, 1 a check failed, 3 cannot run here).
status=0
"$work/venv/bin/maxtext-rl-overlay" smoke --json "$json" $simulation || status=$?
exit "$status"
