// LaunchDenseGemvBf16 (kernels/cuda/ops/dense_gemv.h): a CTA of 8 warps holds 8 / kSplit output
// columns; the kSplit warps of a column take its 16-byte chunks of k in turn (warp part p: chunks
// (i kSplit + p) 32 + lane), kUnroll loads in flight per lane, each weight chunk multiplied with
// every row of x (read through L1: every warp of the SM reads the same rows). A warp sums its
// lanes by shuffles; the column's parts meet in shared memory in part order.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/common/device_info.h"
#include "kernels/cuda/common/gemv_loads.cuh"
#include "kernels/cuda/common/pdl_launch.cuh"
#include "kernels/cuda/common/ptx_ops.cuh"
#include "kernels/cuda/ops/dense_gemv.h"

namespace llm::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kUnroll = 4;  // 16-byte weight loads in flight per lane

using ptx::Bf16x2ToFloat2;
using ptx::LoadStream16;

// acc + (8 bf16 of w) . (8 bf16 of x), in k order.
__device__ __forceinline__ float Dot8(const uint4& w, const uint4& x, float acc) {
  const uint32_t ww[4] = {w.x, w.y, w.z, w.w}, xx[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 a = Bf16x2ToFloat2(ww[i]), b = Bf16x2ToFloat2(xx[i]);
    acc = fmaf(a.x, b.x, acc);
    acc = fmaf(a.y, b.y, acc);
  }
  return acc;
}

template <int kR, int kSplit, bool kOutF32>
__global__ void __launch_bounds__(kThreads)
    DenseGemvKernel(const uint4* __restrict__ x, const uint4* __restrict__ w, int64_t n,
                    int64_t chunks, void* __restrict__ y) {
  constexpr int kCols = kWarps / kSplit;
  __shared__ float part_sum[kWarps][kR];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int part = warp % kSplit;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kCols + warp / kSplit;
  const bool live = col < n;  // warp-uniform; every warp reaches the barrier
  const uint4* wrow = w + (live ? col : 0) * chunks;
  // Chunk of round u of pass i: ((i kUnroll + u) kSplit + part) 32 + lane.
  const int64_t stride = static_cast<int64_t>(32) * kSplit;
  const int64_t first = static_cast<int64_t>(part) * 32 + lane;
  // The first pass's weights before the wait: they do not depend on the kernel before.
  uint4 wv[kUnroll];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t c = first + u * stride;
    wv[u] = live && c < chunks ? LoadStream16(wrow + c) : make_uint4(0, 0, 0, 0);
  }
  ptx::GridDependencySync();  // x comes from the kernel before
  float acc[kR];
#pragma unroll
  for (int r = 0; r < kR; ++r) acc[r] = 0.f;
  for (int64_t c0 = first; live && c0 < chunks; c0 += kUnroll * stride) {
    uint4 next[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t c = c0 + (kUnroll + u) * stride;
      next[u] = c < chunks ? LoadStream16(wrow + c) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t c = c0 + u * stride;
      if (c < chunks) {
#pragma unroll
        for (int r = 0; r < kR; ++r) acc[r] = Dot8(wv[u], __ldg(x + r * chunks + c), acc[r]);
      }
      wv[u] = next[u];
    }
  }
#pragma unroll
  for (int r = 0; r < kR; ++r) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(0xFFFFFFFFu, acc[r], o);
  }
  if constexpr (kSplit > 1) {
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < kR; ++r) part_sum[warp][r] = acc[r];
    }
    __syncthreads();
    if (part != 0) return;
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      float s = part_sum[warp][r];
#pragma unroll
      for (int p = 1; p < kSplit; ++p) s += part_sum[warp + p][r];
      acc[r] = s;
    }
  }
  if (!live || lane >= kR) return;
  // Lane r stores row r.
  float v = acc[0];
#pragma unroll
  for (int r = 1; r < kR; ++r) v = lane == r ? acc[r] : v;
  const int64_t at = static_cast<int64_t>(lane) * n + col;
  if constexpr (kOutF32) {
    static_cast<float*>(y)[at] = v;
  } else {
    static_cast<__nv_bfloat16*>(y)[at] = __float2bfloat16_rn(v);
  }
}

template <int kR, int kSplit>
void Launch(const void* x, const void* w, int64_t n, int64_t k, void* y, bool out_fp32,
            cudaStream_t stream) {
  constexpr int kCols = kWarps / kSplit;
  const dim3 grid(static_cast<unsigned>((n + kCols - 1) / kCols));
  const auto* xv = static_cast<const uint4*>(x);
  const auto* wv = static_cast<const uint4*>(w);
  const int64_t chunks = k / 8;
  if (out_fp32) {
    (void)LaunchPdl(DenseGemvKernel<kR, kSplit, true>, grid, dim3(kThreads), 0, stream, xv, wv, n,
                    chunks, y);
  } else {
    (void)LaunchPdl(DenseGemvKernel<kR, kSplit, false>, grid, dim3(kThreads), 0, stream, xv, wv, n,
                    chunks, y);
  }
}

template <int kR>
void LaunchSplit(const void* x, const void* w, int64_t n, int64_t k, void* y, bool out_fp32,
                 int split, cudaStream_t stream) {
  switch (split) {
    case 8:
      return Launch<kR, 8>(x, w, n, k, y, out_fp32, stream);
    case 4:
      return Launch<kR, 4>(x, w, n, k, y, out_fp32, stream);
    case 2:
      return Launch<kR, 2>(x, w, n, k, y, out_fp32, stream);
    default:
      return Launch<kR, 1>(x, w, n, k, y, out_fp32, stream);
  }
}

}  // namespace

int DenseGemvDefaultSplitK(int64_t n, int64_t k, int num_sms) {
  // About 32 resident warps per SM: split while the doubled grid stays within one wave and each
  // part keeps at least one whole round (32 lanes x kUnroll chunks) of k.
  const int64_t wave = static_cast<int64_t>(std::max(num_sms, 1)) * 32;
  int split = 1;
  while (split < 8 && n * split * 2 <= wave && k / 8 >= int64_t{32} * kUnroll * split * 2) {
    split *= 2;
  }
  return split;
}

bool LaunchDenseGemvBf16(const void* x, const void* w, int rows, int64_t n, int64_t k, void* y,
                         bool out_fp32, void* stream, int split_k) {
  if (!DenseGemvShapeOk(rows, n, k)) return false;
  const int split = split_k > 0 ? split_k : DenseGemvDefaultSplitK(n, k, CudaNumSms());
  auto s = static_cast<cudaStream_t>(stream);
  if (rows == 1) {
    LaunchSplit<1>(x, w, n, k, y, out_fp32, split, s);
  } else if (rows == 2) {
    LaunchSplit<2>(x, w, n, k, y, out_fp32, split, s);
  } else if (rows == 3) {
    LaunchSplit<3>(x, w, n, k, y, out_fp32, split, s);
  } else {
    LaunchSplit<4>(x, w, n, k, y, out_fp32, split, s);
  }
  return true;
}

}  // namespace llm::cuda
