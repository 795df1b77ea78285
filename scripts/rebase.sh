#!/usr/bin/env bash
# Carry a patch series onto a new upstream commit. Usage: scripts/rebase.sh NAME NEW_REF [--source PATH] [--build]
# [--apply-vllm-lkg] [--find-base]; after a conflict: scripts/rebase.sh --continue | --abort
set -euo pipefail
exec "$(dirname "$0")/overlay-tool.sh" rebase "$@"
