// Online-softmax kernels of the chunked MLA prefill (mla_prefill_softmax.h). Written against
// kernels/gpu_port.h only (warp shuffles, bf16 rounding), like the portable kernels.
#include <cstdint>

#include "kernels/cuda/mla/mla_prefill_softmax.h"
#include "kernels/gpu_port.h"

namespace llm::cuda::mla {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / gpu::kWarpSize;
constexpr int kNormalizeThreads = 128;

// Max or sum over the CTA; every thread gets the result. `partial` is kWarps shared floats, free
// again when this returns.
template <bool kMax>
__device__ float BlockReduce(float v, float* partial) {
  for (int o = gpu::kWarpSize / 2; o > 0; o >>= 1) {
    const float w = gpu::ShflXor(v, o);
    v = kMax ? fmaxf(v, w) : v + w;
  }
  if (gpu::LaneId() == 0) partial[gpu::WarpId()] = v;
  __syncthreads();
  v = partial[0];
  for (int w = 1; w < kWarps; ++w) v = kMax ? fmaxf(v, partial[w]) : v + partial[w];
  __syncthreads();
  return v;
}

__device__ __forceinline__ uint16_t ToBf16(float x) {
  return static_cast<uint16_t>(gpu::Bf16::Pack(x, 0.f));  // x in the low half
}

__global__ void __launch_bounds__(kThreads) ChunkSoftmaxKernel(const ChunkSoftmaxArgs a) {
  __shared__ float partial[kWarps];
  const int h = static_cast<int>(blockIdx.x) / a.rows, i = static_cast<int>(blockIdx.x) % a.rows;
  const size_t row = static_cast<size_t>(blockIdx.x) * a.cols;
  const float* s = a.scores + row;
  uint16_t* p = static_cast<uint16_t*>(a.probs) + row;
  const int valid = min(a.cols, max(0, a.first_pos + i + 1 - a.k0));  // keys the row sees
  if (valid == 0) {  // the whole CTA leaves here: the state stays, P @ V adds zeros
    for (int j = threadIdx.x; j < a.cols; j += kThreads) p[j] = 0;
    return;
  }
  const size_t st = static_cast<size_t>(i) * a.heads + h;
  const float m_old = a.first_chunk ? -INFINITY : a.row_max[st];
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < valid; j += kThreads) mx = fmaxf(mx, s[j] * a.scale);
  // Finite: the row sees at least one (finite) score here, so exp(m_old - m_new) below is never
  // exp(-inf + inf).
  const float m_new = fmaxf(m_old, BlockReduce<true>(mx, partial));
  float sum = 0.f;
  for (int j = threadIdx.x; j < a.cols; j += kThreads) {
    uint16_t b = 0;
    if (j < valid) {
      b = ToBf16(expf(s[j] * a.scale - m_new));
      sum += gpu::Bf16::ToFloat(b);  // the value P @ V multiplies
    }
    p[j] = b;
  }
  sum = BlockReduce<false>(sum, partial);
  if (a.first_chunk) {
    if (threadIdx.x == 0) {
      a.row_max[st] = m_new;
      a.row_sum[st] = sum;
    }
    return;
  }
  const float alpha = expf(m_old - m_new);
  if (alpha != 1.f) {
    float* o = a.acc + st * a.v_dim;
    for (int d = threadIdx.x; d < a.v_dim; d += kThreads) o[d] *= alpha;
  }
  if (threadIdx.x == 0) {  // every thread read m_old before the reductions' barriers
    a.row_max[st] = m_new;
    a.row_sum[st] = a.row_sum[st] * alpha + sum;
  }
}

// One CTA per (row, head).
__global__ void __launch_bounds__(kNormalizeThreads)
    NormalizeRowsKernel(const float* acc, const float* row_sum, int v_dim, uint16_t* out) {
  const size_t rh = blockIdx.x;
  const float inv = 1.f / row_sum[rh];  // sum >= 1: the row's largest probability is exp(0)
  const float* x = acc + rh * v_dim;
  uint16_t* y = out + rh * v_dim;
  for (int d = threadIdx.x; d < v_dim; d += kNormalizeThreads) y[d] = ToBf16(x[d] * inv);
}

}  // namespace

void LaunchChunkSoftmax(const ChunkSoftmaxArgs& a, void* stream) {
  if (a.heads * a.rows == 0 || a.cols == 0) return;
  ChunkSoftmaxKernel<<<a.heads * a.rows, kThreads, 0, static_cast<gpu::Stream>(stream)>>>(a);
}

void LaunchNormalizeRows(const float* acc, const float* row_sum, int rows, int heads, int v_dim,
                         void* out, void* stream) {
  if (rows * heads == 0) return;
  NormalizeRowsKernel<<<rows * heads, kNormalizeThreads, 0, static_cast<gpu::Stream>(stream)>>>(
      acc, row_sum, v_dim, static_cast<uint16_t*>(out));
}

}  // namespace llm::cuda::mla
