#!/usr/bin/env bash
# Runs on the GPU machine: the same end-to-end workload (scripts/gpu_e2e.sh and its E2E_*
# variables) once per server binary, alternating, in one call, so two builds are compared on
# the same machine state (power caps and board differences move separate calls' results more
# than most changes do).
#   scripts/gpu_e2e_ab.sh .devpack/bin/llm-server-base .devpack/bin/llm-server-new [rounds]
# E2E_EXTRA_A / E2E_EXTRA_B: server flags for one side only (added to E2E_EXTRA), so one binary
# can be compared with itself under two settings:
#   E2E_EXTRA="--weight-dtype fp8" E2E_EXTRA_B="--fp8-fast-accumulation true" \
#     scripts/gpu_e2e_ab.sh .devpack/bin/llm-server .devpack/bin/llm-server
# Pack both binaries with ../shared/gpu/pack.sh (their libraries are the same). Results under
# $OUT/ab_<round>_<name>/; the summary lines are printed.
set -uo pipefail
[ $# -ge 2 ] || { echo "usage: $0 SERVER_A SERVER_B [ROUNDS]"; exit 2; }
A="$1"; B="$2"; ROUNDS="${3:-1}"
OUT_ROOT="${OUT:-$(pwd)/gpu-out}"
target=.devpack/bin/llm-server
[ -e "$target" ] && cp "$target" "$target.ab-orig"
for r in $(seq 1 "$ROUNDS"); do
  for side in A B; do
    if [ $side = A ]; then bin="$A"; extra="${E2E_EXTRA_A:-}"; else bin="$B"; extra="${E2E_EXTRA_B:-}"; fi
    name=$(basename "$bin")_$side
    src="$bin"
    [ "$bin" -ef "$target" ] && src="$target.ab-orig"  # the server binary itself: its saved copy
    cp "$src" "$target"
    echo "== round $r: $name ${extra}"
    OUT="$OUT_ROOT/ab_${r}_${name}" E2E_EXTRA="${E2E_EXTRA:-} $extra" bash scripts/gpu_e2e.sh 2>&1 |
      grep -E "Duration|Output token|TTFT |TPOT |step forward|GPU while busy"
  done
done
[ -e "$target.ab-orig" ] && mv "$target.ab-orig" "$target"
