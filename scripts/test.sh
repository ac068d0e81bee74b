#!/usr/bin/env bash
# Installs, builds and runs every test: the CPU build, the ASan+UBSan build, the format check, and
# the Docker build stage (release build + installed-server health probe). GPU tests skip with a
# message when no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh cpu
ctest --preset cpu -j 2
if [ "${LLM_SKIP_ASAN:-0}" != "1" ]; then
  cmake --preset asan >/dev/null
  cmake --build --preset asan -j "$(nproc)"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --preset asan -j 2
fi
scripts/check_format.sh
if [ "${LLM_SKIP_DOCKER_STAGE:-0}" != "1" ]; then
  scripts/docker_smoke.sh
fi
echo "ALL TESTS PASSED"
