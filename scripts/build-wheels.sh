#!/usr/bin/env bash
# Build the overlay wheels, the index (dist/) and constraints.txt from the pins
# and patches/. Usage: scripts/build-wheels.sh [--source NAME=PATH]... [--only NAME[,NAME...]] [--out DIR] [--base-url URL]
set -euo pipefail
exec "$(dirname "$0")/overlay-tool.sh" build "$@"
