#!/usr/bin/env bash
# Everything the Docker build stage runs, as one script so CI can run it too (CI has no Docker
# engine): dependencies, CUDA toolkit, the release build, and the install tree under $1.
#   scripts/docker_build_stage.sh /opt/llm
set -euo pipefail
cd "$(dirname "$0")/.."
prefix="${1:-/opt/llm}"
scripts/install_deps.sh
scripts/install_cuda_toolkit.sh
export PATH="/usr/local/cuda/bin:$PATH"
cmake --preset release -DLLM_BUILD_TESTS=OFF >/dev/null
cmake --build --preset release -j "$(nproc)" --target llm-server llm-healthcheck make_tiny_model
mkdir -p "$prefix/bin" "$prefix/models" "$prefix/configs"
cp build/release/server/llm-server build/release/tools/llm-healthcheck \
   build/release/tools/make_tiny_model "$prefix/bin/"
build/release/tools/make_tiny_model "$prefix/models/tiny-llama" >/dev/null
cp configs/server.json "$prefix/configs/"
echo "docker_build_stage: installed into $prefix"
