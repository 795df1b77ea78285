#!/usr/bin/env bash
# The TPU cell's bundle: a release made ready for a TPU host with its own JAX
# and no network (docs/tpu-cell.md). Usage:
#   scripts/tpu-cell.sh --release DIST --out BUNDLE --host-index URL_OR_DIR... [--host-python 3.11] [--host-override NAME==VERSION]...
# The pins' sources (tpu-inference's tests, vLLM's rebuild) are taken as the
# tests take them (MRL_SOURCES, or ../shared/upstream) unless --source names them.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/scripts/lib.sh"
sources=()
for s in $(upstream_sources "$root"); do
  case " $* " in *" --source ${s%%=*}="*) ;; *) sources+=(--source "$s") ;; esac
done
exec "$root/scripts/overlay-tool.sh" tpu-cell bundle "${sources[@]}" "$@"
