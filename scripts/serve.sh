#!/usr/bin/env bash
# Installs, builds and starts the server. With no model directory it serves the embedded default
# model (tiny-llama: RANDOM weights, gibberish output). Extra arguments go to llm-server.
#   scripts/serve.sh [MODEL_DIR] [--listen-address 127.0.0.1:50051 ...]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh cpu
model="build/cpu/models/tiny-llama"
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then model="$1"; shift; fi
exec build/cpu/server/llm-server --model "$model" "$@"
