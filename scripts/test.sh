#!/usr/bin/env bash
# Installs, builds and runs every test: the CUDA build (sm_90a) with its GPU tests (skipped with a
# message where no GPU is present), the HIP build of the portable kernels (compile only), the
# CUDA image's build stage (installed-server health probe), the CPU Docker image built with
# podman and checked from inside (health check, one Generate call), the format check, the
# ASan+UBSan build and its tests, and last the CPU build's full test suite, whose summary ends the
# log.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh cpu
# The real Hugging Face tokenizer files (pinned, checksummed) before any test suite: ctest's own
# fetch_tokenizers entry orders only the tests that declare it, and the unit tests read them too.
scripts/fetch_tokenizers.sh
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  # CUDA backend for sm_90a; GPU tests report "skipped" where no GPU is present.
  export PATH="/usr/local/cuda/bin:$PATH"
  cmake --preset cuda >/dev/null
  cmake --build --preset cuda -j "$(nproc)" --target gpu_tests llm-server llm-healthcheck \
    make_tiny_model c8_attention_bench fmha_bench mla_decode_bench
  ctest --preset cuda -R gpu_tests
else
  echo "test.sh: no nvcc; CUDA backend not built"
fi
# HIP build for gfx90a (compile only: no AMD GPU here; install_deps.sh installs hipcc): the
# portable kernels, and the server and unit tests linked with them; the selection tests check that
# hip_fmha attached its factory.
cmake --preset hip >/dev/null
cmake --build --preset hip -j"$(nproc)" --target llm_hip_kernels llm-server unit_tests
build/hip/tests/unit_tests "[selection]"
# The CUDA image's build stage, run on the host into a scratch prefix (reuses build/cuda; building
# the CUDA image itself would download NVIDIA's toolkit and compile every kernel from scratch).
if [ "${LLM_SKIP_DOCKER_STAGE:-0}" != "1" ]; then
  BACKEND=cuda LLM_DOCKER_PRESET=cuda scripts/docker_smoke.sh
fi
# The CPU image, built by podman from the Dockerfile and checked from its test stage.
if [ "${LLM_SKIP_DOCKER_IMAGE:-0}" != "1" ]; then
  scripts/docker_image_test.sh
else
  echo "test.sh: LLM_SKIP_DOCKER_IMAGE=1: CPU image NOT built or checked"
fi
scripts/check_format.sh
# No include runs up a layer (base < kernels, kvcache, text < scheduler < engine < server).
/usr/bin/python3 scripts/check_layers.py
# Every file, folder and C++ name the main docs cite still exists in the tree.
/usr/bin/python3 scripts/check_doc_names.py
if [ "${LLM_SKIP_ASAN:-0}" != "1" ]; then
  cmake --preset asan >/dev/null
  cmake --build --preset asan -j "$(nproc)"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --preset asan -j 2
fi
# The CPU suite runs last so that its summary (every unit, Python and end-to-end test) closes
# the log.
ctest --preset cpu -j 2
echo "ALL TESTS PASSED"
