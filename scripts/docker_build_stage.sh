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
# The image builds every default CUDA architecture (release preset); CI passes
# LLM_DOCKER_PRESET=cuda (sm_90a only) to stay within its time budget.
preset="${LLM_DOCKER_PRESET:-release}"
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" -j "$(nproc)" --target llm-server llm-healthcheck make_tiny_model
bin="build/$preset"
mkdir -p "$prefix/bin" "$prefix/models" "$prefix/configs"
cp "$bin/server/llm-server" "$bin/tools/llm-healthcheck" "$bin/tools/make_tiny_model" "$prefix/bin/"
"$bin/tools/make_tiny_model" "$prefix/models/tiny-llama" >/dev/null
cp configs/server.json "$prefix/configs/"
# The CUDA runtime libraries the server links (cudart, cuBLAS/cuBLASLt), not the whole toolkit;
# the driver (libcuda) comes from the host through the NVIDIA container runtime.
mkdir -p "$prefix/lib"
ldd "$bin/server/llm-server" | awk '/libcudart|libcublas/ {print $3}' | while read -r lib; do
  cp -L "$lib" "$prefix/lib/"
done
echo "docker_build_stage: installed into $prefix"
