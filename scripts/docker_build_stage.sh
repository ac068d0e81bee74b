#!/usr/bin/env bash
# Everything the Dockerfile's build stage runs, as one script so CI can also run it on the host:
# build dependencies, the CUDA toolkit (BACKEND=cuda only), the server build and the install tree.
#   BACKEND=cpu|cuda scripts/docker_build_stage.sh PREFIX [TEST_PREFIX]
# PREFIX receives what the runtime image ships (bin/, lib/, models/, configs/); TEST_PREFIX, when
# given, receives what only the image's test stage uses (the generated Python client).
set -euo pipefail
cd "$(dirname "$0")/.."
prefix="${1:-/opt/llm}"
test_prefix="${2:-}"
backend="${BACKEND:-cuda}"
scripts/install_deps.sh --image
case "$backend" in
  cuda)
    scripts/install_cuda_toolkit.sh
    export PATH="/usr/local/cuda/bin:$PATH"
    # The image builds every default CUDA architecture (release preset); CI passes
    # LLM_DOCKER_PRESET=cuda (sm_90a only) to stay within its time budget.
    preset="${LLM_DOCKER_PRESET:-release}"
    ;;
  cpu) preset="${LLM_DOCKER_PRESET:-cpu}" ;;
  *)
    echo "docker_build_stage: BACKEND must be cpu or cuda, got '$backend'" >&2
    exit 2
    ;;
esac
cmake --preset "$preset" >/dev/null
targets=(llm-server llm-healthcheck make_tiny_model)
[ -n "$test_prefix" ] && targets+=(llm_proto_python)
cmake --build --preset "$preset" -j "$(nproc)" --target "${targets[@]}"
bin="build/$preset"
mkdir -p "$prefix/bin" "$prefix/models" "$prefix/configs" "$prefix/lib"
cp "$bin/server/llm-server" "$bin/tools/llm-healthcheck" "$bin/tools/make_tiny_model" "$prefix/bin/"
"$bin/tools/make_tiny_model" "$prefix/models/tiny-llama" >/dev/null
cp configs/server.json configs/container.json "$prefix/configs/"
# CUDA: the runtime libraries the server links (cudart, cuBLAS/cuBLASLt), not the whole toolkit;
# the driver (libcuda) comes from the host through the NVIDIA container runtime. CPU: none match.
ldd "$bin/server/llm-server" | awk '/libcudart|libcublas/ {print $3}' | while read -r lib; do
  cp -L "$lib" "$prefix/lib/"
done
if [ -n "$test_prefix" ]; then
  mkdir -p "$test_prefix"
  cp -r "$bin/python" "$test_prefix/"
fi
echo "docker_build_stage: $backend ($preset) installed into $prefix"
