#!/usr/bin/env bash
# Carry a patch series onto a new upstream commit. Usage: scripts/rebase.sh NAME NEW_REF [--source PATH] [--build]
# [--apply-vllm-lkg] [--find-base]; after a conflict: scripts/rebase.sh --continue | --abort
# Exit status (maxtext-rl-overlay's, see its --help): 0 once the series is carried (the output says what to do
# next: without --build, rebuild constraints.txt), 1 at a conflict or when a fast test fails, 2 when the
# command line is wrong, 3 when it could not do its work (the message says why), 4 on a bug of the tool,
# 130 when interrupted.
set -euo pipefail
exec "$(dirname "$0")/overlay-tool.sh" rebase "$@"
