#!/usr/bin/env bash
# Installs dependencies (idempotent), configures and builds a preset (default: cpu).
#   scripts/build.sh [preset]
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-cpu}"
scripts/install_deps.sh
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" -j "$(nproc)"
