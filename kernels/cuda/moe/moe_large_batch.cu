// The element-wise kernels of the MoE layer's large-batch path (kernels/cuda/moe/moe_ops.h): the
// row gather before, and the gated activation and expert biases between and after cuBLAS's grouped
// expert GEMMs. Memory-bound; 8 bf16 per access where the widths allow it (every width the layer
// accepts is a multiple of 64).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/moe/moe_activation.cuh"
#include "kernels/cuda/moe/moe_ops.h"
#include "kernels/cuda/ops/fp8_rows.cuh"

namespace llm::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void GatherKernel(const uint4* x, const int32_t* sorted_token, int chunks, uint4* xg) {
  const int s = blockIdx.x;
  const uint4* src = x + static_cast<size_t>(sorted_token[s]) * chunks;
  uint4* dst = xg + static_cast<size_t>(s) * chunks;
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) dst[c] = src[c];
}

// The expert of expert-ordered row s: the last e with offsets[e] <= s (experts without rows have
// equal offsets; the search lands on the one that owns s).
__device__ __forceinline__ int ExpertOf(const int32_t* offsets, int num_experts, int s) {
  int lo = 0, hi = num_experts - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (offsets[mid] <= s) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// One warp per (row, 128-wide block): the block's absmax gives its scale (fp8_rows.cuh's
// QuantizeBlock128, as LaunchQuantizeBlocks128Fp8), written where the row's expert's GEMM reads it.
__global__ void QuantizeBlocks128ByExpertKernel(const __nv_bfloat16* x, int cols,
                                                const int32_t* offsets, int num_experts, uint8_t* q,
                                                float* scales) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int b = blockIdx.y * (blockDim.x / 32) + warp;
  const int row = blockIdx.x;
  if (b * 128 >= cols) return;  // whole warp: no shuffle below is left half-done
  const int e = ExpertOf(offsets, num_experts, row);
  int before = 0;  // the rows of the experts' GEMMs before e's
  for (int i = lane; i < e; i += 32) before += MoeFp8ExpertRows(offsets[i + 1] - offsets[i]);
  for (int o = 16; o > 0; o >>= 1) before += __shfl_xor_sync(0xffffffff, before, o);
  const int ld = MoeFp8ExpertRows(offsets[e + 1] - offsets[e]);
  const size_t at = static_cast<size_t>(row) * cols;
  const float s = detail::QuantizeBlock128(x + at, cols, b, lane, q + at);
  if (lane == 0) {
    const int blocks = (cols + 127) / 128;
    scales[static_cast<size_t>(before) * blocks + static_cast<size_t>(b) * ld +
           (row - offsets[e])] = s;
  }
}

__global__ void GateActKernel(const __nv_bfloat16* gu, int n, const float* bias,
                              const int32_t* offsets, int num_experts, float limit, float alpha,
                              const float* row_scale, __nv_bfloat16* act) {
  const int s = blockIdx.x;
  const float rs = row_scale ? row_scale[s] : 1.0f;
  const __nv_bfloat16* g = gu + static_cast<size_t>(s) * 2 * n;
  const __nv_bfloat16* u = g + n;
  const float* b =
      bias ? bias + static_cast<size_t>(ExpertOf(offsets, num_experts, s)) * 2 * n : nullptr;
  __nv_bfloat16* out = act + static_cast<size_t>(s) * n;
  for (int j = threadIdx.x * 2; j < n; j += blockDim.x * 2) {
    const float2 gf = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(g + j));
    const float2 uf = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(u + j));
    float gv[2] = {gf.x, gf.y}, uv[2] = {uf.x, uf.y}, v[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      if (row_scale) gv[i] *= rs, uv[i] *= rs;
      if (b) gv[i] += b[j + i], uv[i] += b[n + j + i];
      v[i] = MoeGateUp(gv[i], uv[i], limit, alpha);  // as the tiled kernels' epilogue
    }
    *reinterpret_cast<__nv_bfloat162*>(out + j) = __floats2bfloat162_rn(v[0], v[1]);
  }
}

__global__ void RowBiasKernel(__nv_bfloat16* y, int n, const float* bias, const int32_t* offsets,
                              int num_experts) {
  const int s = blockIdx.x;
  const float* b = bias + static_cast<size_t>(ExpertOf(offsets, num_experts, s)) * n;
  __nv_bfloat16* row = y + static_cast<size_t>(s) * n;
  for (int j = threadIdx.x * 2; j < n; j += blockDim.x * 2) {
    const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(row + j));
    *reinterpret_cast<__nv_bfloat162*>(row + j) = __floats2bfloat162_rn(f.x + b[j], f.y + b[j + 1]);
  }
}

}  // namespace

void LaunchMoeGather(const void* x, const int32_t* sorted_token, int rows, int hidden, void* xg,
                     void* stream) {
  if (rows == 0) return;
  GatherKernel<<<rows, kThreads / 2, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const uint4*>(x), sorted_token, hidden / 8, static_cast<uint4*>(xg));
}

void LaunchMoeGateAct(const void* gu, int rows, int n, const float* bias,
                      const int32_t* expert_offsets, int num_experts, float swiglu_limit,
                      float swiglu_alpha, void* act, void* stream, const float* row_scale) {
  if (rows == 0) return;
  GateActKernel<<<rows, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const __nv_bfloat16*>(gu), n, bias, expert_offsets, num_experts, swiglu_limit,
      swiglu_alpha, row_scale, static_cast<__nv_bfloat16*>(act));
}

void LaunchMoeQuantizeBlocks128ByExpert(const void* x, int rows, int cols,
                                        const int32_t* expert_offsets, int num_experts, void* q,
                                        float* scales, void* stream) {
  if (rows == 0) return;
  constexpr int kWarps = 4;
  const int blocks = (cols + 127) / 128;
  const dim3 grid(rows, (blocks + kWarps - 1) / kWarps);
  QuantizeBlocks128ByExpertKernel<<<grid, kWarps * 32, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const __nv_bfloat16*>(x), cols, expert_offsets, num_experts,
      static_cast<uint8_t*>(q), scales);
}

void LaunchMoeRowBias(void* y, int rows, int n, const float* bias, const int32_t* expert_offsets,
                      int num_experts, void* stream) {
  if (rows == 0) return;
  RowBiasKernel<<<rows, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<__nv_bfloat16*>(y), n, bias, expert_offsets, num_experts);
}

}  // namespace llm::cuda
