// The lazy online-softmax update shared by the C8 tile kernel's two math layouts (internal).
#pragma once

#include <cfloat>

#include "kernels/cuda/c8/c8_window.h"
#include "kernels/cuda/common/ptx_ops.cuh"

namespace llm::cuda::detail {

// The running max is kept in raw-score units and only moves when a query's max grows by more
// than kLazyLog2 in the exp2 domain, so most steps skip the accumulator rescale; probabilities
// then reach at most 2^kLazyLog2, well inside fp16/bf16 range.
constexpr float kLazyLog2 = 8.f;

// mx: this step's max per query slot (already reduced over the step's tokens). If any slot of
// the warp grew past the slack (or saw its first visible key), moves those maxima, scales l by
// alpha and returns true: the caller then scales its accumulators by alpha (warp-uniform).
template <int N>
__device__ __forceinline__ bool LazyMaxUpdate(const float (&mx)[N], float (&m_run)[N],
                                              float (&l_run)[N], float (&alpha)[N],
                                              float scale_log2, float lazy_raw) {
  bool grow[N];
  bool any = false;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    grow[i] = mx[i] > m_run[i] + lazy_raw;
    any = any || grow[i];
  }
  if (!__any_sync(0xffffffff, any)) return false;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const float m_new = grow[i] ? mx[i] : m_run[i];
    alpha[i] = m_run[i] == -INFINITY ? 0.f : ptx::Exp2Ftz((m_run[i] - m_new) * scale_log2);
    m_run[i] = m_new;
    l_run[i] *= alpha[i];
  }
  return true;
}

// -m * scale_log2 for exp2(s * scale_log2 - m * scale_log2); a query with no visible key so far
// keeps m = -inf and its probabilities must come out 0, not NaN.
__device__ __forceinline__ float NegMaxLog2(float m_run, float scale_log2) {
  return m_run == -INFINITY ? 0.f : -m_run * scale_log2;
}

}  // namespace llm::cuda::detail
