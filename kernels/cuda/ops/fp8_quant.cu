#include "kernels/cuda/ops/fp8_quant.h"

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/common/pdl_launch.cuh"
#include "kernels/cuda/common/ptx_ops.cuh"
#include "kernels/cuda/ops/block_abs_max.cuh"
#include "kernels/cuda/ops/fp8_rows.cuh"

namespace llm::cuda {
namespace {

using detail::Fp8Scale;
using detail::ToFp8;

// Both kernels move 8 elements per 16-byte access where x is 16-byte aligned (always, for the
// model's buffers), with a scalar loop for the rest.
constexpr int kVec = 8;

__device__ __forceinline__ bool Aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

__global__ void AbsMaxKernel(const __nv_bfloat16* x, int64_t n, float* amax) {
  float m = 0.f;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t nv = Aligned16(x) ? n / kVec : 0;
  for (int64_t i = tid; i < nv; i += stride) {
    const uint4 w = reinterpret_cast<const uint4*>(x)[i];
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&w);
#pragma unroll
    for (int k = 0; k < kVec / 2; ++k) {
      const float2 f = __bfloat1622float2(h[k]);
      m = fmaxf(m, fmaxf(fabsf(f.x), fabsf(f.y)));
    }
  }
  for (int64_t i = nv * kVec + tid; i < n; i += stride) m = fmaxf(m, fabsf(__bfloat162float(x[i])));
  detail::BlockFoldAbsMax(m, amax);
}

__global__ void QuantizeKernel(const __nv_bfloat16* x, int64_t n, const float* amax, float* scale,
                               __nv_fp8_storage_t* out) {
  const float s = Fp8Scale(*amax);
  if (blockIdx.x == 0 && threadIdx.x == 0) *scale = s;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t nv = Aligned16(x) && (reinterpret_cast<uintptr_t>(out) & 7u) == 0 ? n / kVec : 0;
  for (int64_t i = tid; i < nv; i += stride) {
    const uint4 w = reinterpret_cast<const uint4*>(x)[i];
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&w);
    uint32_t q[2] = {0u, 0u};
#pragma unroll
    for (int k = 0; k < kVec / 2; ++k) {
      const float2 f = __bfloat1622float2(h[k]);
      const uint32_t pair =
          static_cast<uint32_t>(ToFp8(f.x, s)) | (static_cast<uint32_t>(ToFp8(f.y, s)) << 8);
      q[k / 2] |= pair << (16 * (k % 2));
    }
    reinterpret_cast<uint2*>(out)[i] = make_uint2(q[0], q[1]);
  }
  for (int64_t i = nv * kVec + tid; i < n; i += stride) out[i] = ToFp8(__bfloat162float(x[i]), s);
}

// One CTA per row: the row's absmax, then its bytes (the second read of the row hits L1/L2).
__global__ void QuantizeRowsKernel(const __nv_bfloat16* x, int cols, uint8_t* q, float* scales) {
  ptx::GridDependencySync();  // launched with LaunchPdl
  const size_t row = blockIdx.x;
  const __nv_bfloat16* xr = x + row * cols;
  uint8_t* qr = q + row * cols;
  const bool vec = cols % 8 == 0 && Aligned16(x) && (reinterpret_cast<uintptr_t>(q) & 7u) == 0;
  float m = 0.f;
  if (vec) {
    for (int i = threadIdx.x * 8; i < cols; i += blockDim.x * 8) {
      const uint4 w = *reinterpret_cast<const uint4*>(xr + i);
      const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&w);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float2 f = __bfloat1622float2(h[k]);
        m = fmaxf(m, fmaxf(fabsf(f.x), fabsf(f.y)));
      }
    }
  } else {
    for (int i = threadIdx.x; i < cols; i += blockDim.x)
      m = fmaxf(m, fabsf(__bfloat162float(xr[i])));
  }
  const float s = Fp8Scale(detail::BlockMax(m));
  if (threadIdx.x == 0) scales[row] = s;
  if (vec) {
    for (int i = threadIdx.x * 8; i < cols; i += blockDim.x * 8) {
      const uint4 w = *reinterpret_cast<const uint4*>(xr + i);
      const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&w);
      float f[8];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float2 p = __bfloat1622float2(h[k]);
        f[2 * k] = p.x;
        f[2 * k + 1] = p.y;
      }
      detail::StoreFp8x8(qr + i, f, s);
    }
  } else {
    for (int i = threadIdx.x; i < cols; i += blockDim.x) qr[i] = ToFp8(__bfloat162float(xr[i]), s);
  }
}

__global__ void QuantizeRowsStaticKernel(const __nv_bfloat16* x, int cols, const float* scale,
                                         uint8_t* q, float* scales) {
  const size_t row = blockIdx.x;
  const float s = *scale;
  if (threadIdx.x == 0) scales[row] = s;
  const __nv_bfloat16* xr = x + row * cols;
  uint8_t* qr = q + row * cols;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) qr[i] = ToFp8(__bfloat162float(xr[i]), s);
}

// One warp per 128-column block (4 columns a lane), blockIdx.x the row.
__global__ void QuantizeBlocks128Kernel(const __nv_bfloat16* x, int rows, int cols, uint8_t* q,
                                        float* scales, int scale_ld) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int b = blockIdx.y * (blockDim.x / 32) + warp;
  const size_t row = blockIdx.x;
  if (b * 128 >= cols) return;  // whole warp: no shuffle below is left half-done
  const float s = detail::QuantizeBlock128(x + row * cols, cols, b, lane, q + row * cols);
  if (lane == 0) scales[static_cast<size_t>(b) * scale_ld + row] = s;
  (void)rows;
}

// One CTA per row; 8 values per 16-byte access where every row is 16-byte aligned (prompt chunks
// run this over tens of thousands of rows: the scalar loop moved 2 bytes per access).
__global__ void ScaleRowsKernel(__nv_bfloat16* y, const float* scale, int cols) {
  const size_t row = blockIdx.x;
  const float s = scale[row];
  __nv_bfloat16* yr = y + row * cols;
  if (cols % kVec == 0 && Aligned16(y)) {
    uint4* v = reinterpret_cast<uint4*>(yr);
    for (int i = threadIdx.x; i < cols / kVec; i += blockDim.x) {
      uint4 w = v[i];
      __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&w);
#pragma unroll
      for (int k = 0; k < kVec / 2; ++k) {
        const float2 f = __bfloat1622float2(h[k]);
        h[k] = __floats2bfloat162_rn(f.x * s, f.y * s);
      }
      v[i] = w;
    }
    return;
  }
  for (int i = threadIdx.x; i < cols; i += blockDim.x) {
    yr[i] = __float2bfloat16(__bfloat162float(yr[i]) * s);
  }
}

int Blocks(int64_t n) {
  return static_cast<int>(std::clamp<int64_t>((n / kVec + 255) / 256, 1, 1024));
}

}  // namespace

void LaunchAbsMaxBf16(const void* x, int64_t n, float* amax, void* stream) {
  if (n == 0) return;
  AbsMaxKernel<<<Blocks(n), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const __nv_bfloat16*>(x), n, amax);
}

void LaunchQuantizeFp8(const void* x, int64_t n, const float* amax, float* scale, void* out,
                       void* stream) {
  QuantizeKernel<<<Blocks(n), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const __nv_bfloat16*>(x), n, amax, scale, static_cast<__nv_fp8_storage_t*>(out));
}

void LaunchQuantizeRowsFp8(const void* x, int rows, int cols, const Fp8Rows& out, void* stream) {
  if (rows == 0) return;
  const int threads = std::clamp((cols / 8 + 31) / 32 * 32, 32, 512);
  (void)LaunchPdl(QuantizeRowsKernel, dim3(rows), dim3(threads), 0,
                  static_cast<cudaStream_t>(stream), static_cast<const __nv_bfloat16*>(x), cols,
                  static_cast<uint8_t*>(out.q), out.scale);
}

void LaunchQuantizeRowsStaticFp8(const void* x, int rows, int cols, const float* scale,
                                 const Fp8Rows& out, void* stream) {
  if (rows == 0) return;
  const int threads = std::clamp((cols + 31) / 32 * 32, 32, 256);
  QuantizeRowsStaticKernel<<<rows, threads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const __nv_bfloat16*>(x), cols, scale, static_cast<uint8_t*>(out.q), out.scale);
}

void LaunchQuantizeBlocks128Fp8(const void* x, int rows, int cols, void* q, float* scales,
                                int scale_ld, void* stream) {
  if (rows == 0) return;
  constexpr int kWarps = 4;
  const int blocks = (cols + 127) / 128;
  const dim3 grid(rows, (blocks + kWarps - 1) / kWarps);
  QuantizeBlocks128Kernel<<<grid, kWarps * 32, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const __nv_bfloat16*>(x), rows, cols, static_cast<uint8_t*>(q), scales, scale_ld);
}

void LaunchScaleRowsBf16(void* y, const float* scale, int rows, int cols, void* stream) {
  if (rows == 0) return;
  const int per_row = cols % kVec == 0 ? cols / kVec : cols;  // accesses (the vector path's)
  const int threads = std::clamp((per_row + 31) / 32 * 32, 32, 256);
  ScaleRowsKernel<<<rows, threads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<__nv_bfloat16*>(y), scale, cols);
}

}  // namespace llm::cuda
