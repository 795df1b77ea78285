#!/usr/bin/env bash
# Carry a patch series onto a new upstream commit. Usage: scripts/rebase.sh NAME NEW_REF [--source PATH] [--build]
# [--apply-vllm-lkg] [--find-base]; after a conflict: scripts/rebase.sh --continue | --abort
# Exit status: 0 once the series is carried (the output says what to do next: without --build, rebuild
# constraints.txt), 1 at a conflict or when a fast test fails, 2 on an error.
set -euo pipefail
exec "$(dirname "$0")/overlay-tool.sh" rebase "$@"
