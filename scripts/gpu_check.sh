#!/usr/bin/env bash
# Runs on the GPU machine (H200): GPU tests, compute-sanitizer memcheck on the attention tests,
# the kernel benchmark and the torch SDPA peer, in one call. Results under $OUT (or ./gpu-out).
# Build and pack here first:
#   cmake --preset cuda && cmake --build build/cuda -j2 --target gpu_tests c8_attention_bench
#   ../shared/gpu/pack.sh .devpack build/cuda/tests/gpu_tests build/cuda/bench/c8_attention_bench
# then on the GPU machine: scripts/gpu_check.sh
set -uo pipefail
OUT="${OUT:-$(pwd)/gpu-out}"
mkdir -p "$OUT"
here=$(pwd)
export LD_LIBRARY_PATH="$here/.devpack/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
tests_rc=skipped memcheck_rc=skipped
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  echo "== gpu_tests"
  timeout 300 .devpack/bin/gpu_tests 2>&1 | tail -40 | tee "$OUT/gpu_tests.txt"
  tests_rc=${PIPESTATUS[0]}
  echo "== compute-sanitizer memcheck"
  timeout 400 compute-sanitizer --tool memcheck --error-exitcode 9 .devpack/bin/gpu_tests \
    "C8 attention: long single-sequence decode splits KV and merges" 2>&1 | tail -15 | tee "$OUT/memcheck.txt"
  memcheck_rc=${PIPESTATUS[0]}
fi
if [ "${NCU:-0}" = 1 ]; then
  echo "== ncu (first decode case)"
  timeout 300 ncu --clock-control none --kernel-name regex:C8TileKernel --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
    --section LaunchStats .devpack/bin/c8_attention_bench --iters 3 > "$OUT/ncu.txt" 2>&1
  grep -E "Throughput|Duration|Occupancy|Stall|Warp Cycles|Registers|Shared Memory|Block Limit|Waves|L2 Hit|L1/TEX Hit|Mem Busy|Max Bandwidth|Issued|Eligible" "$OUT/ncu.txt" | head -60
fi
echo "== benchmark"
timeout 300 .devpack/bin/c8_attention_bench --iters 30 2>&1 | tee "$OUT/bench.txt"
echo "== torch SDPA peer"
[ "${SKIP_PEER:-0}" = 1 ] || timeout 300 python3 bench/torch_sdpa_peer.py 2>&1 | tee "$OUT/peer.txt"
echo "gpu_tests rc=$tests_rc memcheck rc=$memcheck_rc" | tee "$OUT/summary.txt"
