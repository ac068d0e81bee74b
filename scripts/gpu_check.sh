#!/usr/bin/env bash
# Runs on the GPU machine: every GPU test, compute-sanitizer memcheck on quick subsets of
# the kernel tests, the kernel benchmarks and their torch peers, in one call. Results under $OUT
# (or ./gpu-out: summary, gpu_tests, memcheck, bench, peers .txt); a summary table is printed last.
# Build and pack here first (docs/BENCHMARKS.md, "Commands"):
#   cmake --preset cuda && cmake --build build/cuda -j2 --target gpu_tests c8_attention_bench \
#       fmha_bench mla_decode_bench model_step_bench
#   ../shared/gpu/pack.sh .devpack build/cuda/tests/gpu_tests build/cuda/bench/*_bench
# then on the GPU machine: scripts/gpu_check.sh
# Environment: SKIP_TESTS=1, SKIP_MEMCHECK=1, SKIP_BENCH=1, SKIP_MODEL_BENCH=1, SKIP_PEER=1,
# NCU=1 (profile C8 decode),
# TESTS="<catch2 filter>" (default: every test).
set -uo pipefail
OUT="${OUT:-$(pwd)/gpu-out}"
mkdir -p "$OUT"
here=$(pwd)
bin="$here/.devpack/bin"
export LD_LIBRARY_PATH="$here/.devpack/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/summary.txt"
summary=()
record() { summary+=("$(printf '%-34s %s' "$1" "$2")"); }

if [ "${SKIP_TESTS:-0}" != 1 ]; then
  echo "== gpu_tests ${TESTS:-}"
  timeout 420 "$bin/gpu_tests" ${TESTS:+"$TESTS"} > "$OUT/gpu_tests.txt" 2>&1
  rc=$?
  tail -25 "$OUT/gpu_tests.txt"
  record "gpu_tests" "rc=$rc $(grep -E '^(All tests passed|test cases:)' "$OUT/gpu_tests.txt" | tail -1)"
fi
if [ "${SKIP_MEMCHECK:-0}" != 1 ]; then
  # Quick subsets: memcheck slows kernels 10-100x.
  for filter in "C8 attention: long single-sequence decode splits KV and merges" \
      "C8 attention in CUDA graphs: one capture per bucket replays different decode steps" \
      "GPU decode steps replayed from CUDA graphs give the eager launches' tokens" "[fmha][quick]" \
      "[mla_sanitize]" "[sampling_sanitize]"; do
    echo "== compute-sanitizer memcheck: $filter"
    timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/gpu_tests" "$filter" \
      > "$OUT/memcheck.txt.part" 2>&1
    rc=$?
    tail -4 "$OUT/memcheck.txt.part"
    cat "$OUT/memcheck.txt.part" >> "$OUT/memcheck.txt"
    record "memcheck $filter" "rc=$rc $(grep -m1 'ERROR SUMMARY' "$OUT/memcheck.txt.part")"
  done
  rm -f "$OUT/memcheck.txt.part"
fi
if [ "${NCU:-0}" = 1 ]; then
  echo "== ncu (first decode case)"
  timeout 300 ncu --clock-control none --kernel-name regex:C8TileKernel --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
    --section LaunchStats "$bin/c8_attention_bench" --iters 3 > "$OUT/ncu.txt" 2>&1
  grep -E "Throughput|Duration|Occupancy|Stall|Warp Cycles|Registers|Shared Memory|Block Limit|Waves|L2 Hit|Issued|Eligible" "$OUT/ncu.txt" | head -60
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  for b in c8_attention_bench fmha_bench mla_decode_bench; do
    [ -x "$bin/$b" ] || continue
    echo "== $b"
    timeout 300 "$bin/$b" 2>&1 | tee -a "$OUT/bench.txt"
    record "$b" "rc=${PIPESTATUS[0]}"
  done
fi
if [ "${SKIP_MODEL_BENCH:-0}" != 1 ] && [ -x "$bin/model_step_bench" ]; then
  # Whole Llama-3-8B steps (dummy weights): eager launches against CUDA graphs.
  for kv in int8 auto; do
    echo "== model_step_bench llama3-8b kv=$kv"
    timeout 300 "$bin/model_step_bench" --model configs/models/llama3-8b --kv $kv \
      --batches 1,16,64,256 --ctx 1500 2>&1 | tee -a "$OUT/model_bench.txt"
    record "model_step_bench kv=$kv" "rc=${PIPESTATUS[0]}"
  done
fi
if [ "${SKIP_PEER:-0}" != 1 ]; then
  echo "== torch SDPA peer (cuDNN / FlashAttention-2)"
  timeout 300 python3 bench/torch_sdpa_peer.py 2>&1 | tee -a "$OUT/peers.txt"
  record "torch_sdpa_peer" "rc=${PIPESTATUS[0]}"
  echo "== torch MLA peer (absorbed attention in plain torch)"
  timeout 300 python3 bench/mla_torch_peer.py 2>&1 | tee -a "$OUT/peers.txt"
  record "mla_torch_peer" "rc=${PIPESTATUS[0]}"
fi
echo "== summary"
printf '%s\n' "${summary[@]}" | tee -a "$OUT/summary.txt"
