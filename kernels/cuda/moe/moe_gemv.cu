// The MoE layer's grouped expert GEMMs as GEMVs for decode batches (kernels/cuda/moe/moe_ops.h,
// LaunchMoeGemv) on bf16 weights: the same tiles, gather, biases, gates, dense group and fused
// combine as LaunchMoeGemm. The MXFP4 form is moe_gemv_mxfp4.cu's (through the tensor cores).
//
// With one to a few rows per expert the step is a pure weight stream, and the tiled kernels'
// fat CTAs (64 weight rows x the whole k through a shared-memory ring) leave a batch-1 grid of
// one or two waves whose last is ragged, each CTA paying its pipeline's ramp. Here a warp owns
// one output column of one tile (gate_up: the gate row and its up row; down: one row) over the
// whole k; its lanes read 16-byte runs straight from global memory past L1 (kUnroll per lane and
// weight row issued before any is used), so a CTA of 8 warps is small, many fit on an SM and the
// bytes in flight come from occupancy. The tile's token rows are read through L1 (read-only):
// every warp of the SM reads the same few rows. Each weight is read once per pass over the
// tile's rows (kR rows per pass: one pass for every tile of a decode batch, LaunchMoeGemv picks
// kR from MoeGemmArgs::gemv_max_rows), products are summed in fp32 per lane and across the warp
// by shuffles, and the output rounded to bf16 once at the store.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/common/pdl_launch.cuh"
#include "kernels/cuda/common/ptx_ops.cuh"
#include "kernels/cuda/moe/moe_activation.cuh"
#include "kernels/cuda/moe/moe_gemv.cuh"
#include "kernels/cuda/moe/moe_ops.h"

namespace llm::cuda {
namespace {

using moe_gemv::LoadStream16;
constexpr int kWarps = moe_gemv::kCtaCols;  // a warp per output column
constexpr int kThreads = 32 * kWarps;
constexpr int kUnroll = 4;  // 16-byte weight loads in flight per lane and weight row

// A bf16 pair (the first in the low half) as two floats (exact).
__device__ __forceinline__ float2 Bf16x2ToFloat2(uint32_t u) {
  return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xFFFF0000u));
}

// acc + w[0..7] . (the 8 bf16 of xv), in k order.
__device__ __forceinline__ float Dot8(const float (&w)[8], const uint4& xv, float acc) {
  const uint32_t xw[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = Bf16x2ToFloat2(xw[i]);
    acc = fmaf(w[2 * i], f.x, acc);
    acc = fmaf(w[2 * i + 1], f.y, acc);
  }
  return acc;
}

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  return v;
}

// bf16 weights [E, wrows, k] (the dense group's [wrows, dense_k]); a chunk is one 16-byte
// weight load (8 values). kR token rows per pass.
template <bool kSiluMul, int kR>
__global__ void __launch_bounds__(kThreads) MoeGemvKernel(const MoeGemmArgs a) {
  constexpr int kP = kSiluMul ? 2 : 1;  // weight rows per warp: gate and up, or one
  ptx::GridDependencySync();            // launched with LaunchPdl
  const int tile = blockIdx.y;
  if (tile >= *a.num_tiles) return;
  const int expert = a.tiles[3 * tile], row0 = a.tiles[3 * tile + 1];
  const int rows = a.tiles[3 * tile + 2] - row0;
  const bool dense = expert < 0;  // the shared experts' group
  const int n_out = dense ? a.dense_n_out : a.n_out;
  const int bx = static_cast<int>(blockIdx.x);
  if (bx * kWarps >= n_out) return;  // the wider group's columns (never with a combine)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int col = bx * kWarps + warp;  // this warp's output column
  auto* out = static_cast<__nv_bfloat16*>(dense ? a.dense_out : a.out);
  if (col < n_out) {
    const int K = dense ? a.dense_k : a.k, chunks = K / 8;
    const int wrows = kP * n_out;
    // Weight rows of this warp: gate col and up n_out + col, or col.
    const uint4* wrow[kP];
    const auto* wbase = static_cast<const uint16_t*>(dense ? a.dense_w : a.w);
#pragma unroll
    for (int p = 0; p < kP; ++p) {
      const size_t r = (dense ? 0 : static_cast<size_t>(expert) * wrows) + col + p * n_out;
      wrow[p] = reinterpret_cast<const uint4*>(wbase + r * K);
    }
    const auto* xbase = static_cast<const __nv_bfloat16*>(dense ? a.dense_x : a.x);
    const int32_t* gather = dense ? nullptr : a.sorted_token;
    const float* bias = dense || a.bias == nullptr
                            ? nullptr
                            : a.bias + static_cast<size_t>(expert) * wrows;  // [E][wrows]
    for (int p0 = 0; p0 < rows; p0 += kR) {
      const int nr = min(kR, rows - p0);
      // The pass's token rows as 16-byte units (rows past nr repeat the last: never summed).
      const uint4* xr[kR];
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        const int s = row0 + p0 + min(r, nr - 1);
        const int t = gather ? gather[s] : s;
        xr[r] = reinterpret_cast<const uint4*>(xbase + static_cast<size_t>(t) * K);
      }
      float acc[kP][kR] = {};
      for (int c0 = lane; c0 < chunks; c0 += 32 * kUnroll) {
        uint4 w[kUnroll][kP];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int c = c0 + 32 * u;
#pragma unroll
          for (int p = 0; p < kP; ++p) {
            if (c < chunks) w[u][p] = LoadStream16(wrow[p] + c);
          }
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int c = c0 + 32 * u;
          if (c >= chunks) continue;
          float wf[kP][8];
#pragma unroll
          for (int p = 0; p < kP; ++p) {
            const uint32_t ww[4] = {w[u][p].x, w[u][p].y, w[u][p].z, w[u][p].w};
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const float2 f = Bf16x2ToFloat2(ww[i]);
              wf[p][2 * i] = f.x, wf[p][2 * i + 1] = f.y;
            }
          }
#pragma unroll
          for (int r = 0; r < kR; ++r) {
            if (r < nr) {
              const uint4 xv = __ldg(xr[r] + c);
#pragma unroll
              for (int p = 0; p < kP; ++p) acc[p][r] = Dot8(wf[p], xv, acc[p][r]);
            }
          }
        }
      }
      // Every lane gets the sums; lane r % 32 stores row r.
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        if (r >= nr) break;  // warp-uniform
        float v[kP];
#pragma unroll
        for (int p = 0; p < kP; ++p) v[p] = WarpSum(acc[p][r]);
        if (lane == r % 32) {
          float y;
          if constexpr (kSiluMul) {
            float gt = v[0], up = v[1];
            if (bias) gt += bias[col], up += bias[n_out + col];
            y = MoeGateUp(gt, up, a.swiglu_limit, a.swiglu_alpha);
          } else {
            y = v[0] + (bias ? bias[col] : 0.f);
          }
          out[static_cast<size_t>(row0 + p0 + r) * n_out + col] = __float2bfloat16_rn(y);
        }
      }
    }
  }
  if constexpr (!kSiluMul) {
    if (a.combine.out != nullptr) moe_gemv::CombineAfterCta(a, bx);
  }
}

template <bool kSiluMul, int kR>
void Launch(const MoeGemmArgs& a, cudaStream_t stream) {
  const int n = a.dense_w != nullptr && a.dense_n_out > a.n_out ? a.dense_n_out : a.n_out;
  const dim3 grid(n / kWarps, a.max_tiles);
  (void)LaunchPdl(MoeGemvKernel<kSiluMul, kR>, grid, dim3(kThreads), 0, stream, a);
}

// The rows per pass: 1 (batch 1), 4, or 16 (a whole tile).
template <bool kSiluMul>
void LaunchRows(const MoeGemmArgs& a, cudaStream_t stream) {
  const int bound = a.gemv_max_rows > 0 ? a.gemv_max_rows : kMoeTileRows;
  if (bound <= 1) {
    Launch<kSiluMul, 1>(a, stream);
  } else if (bound <= 4) {
    Launch<kSiluMul, 4>(a, stream);
  } else {
    Launch<kSiluMul, 16>(a, stream);
  }
}

}  // namespace

bool LaunchMoeGemv(const MoeGemmArgs& a, void* stream) {
  const bool mx = a.mx_scales != nullptr;
  if (a.fp8 || a.x_scale != nullptr) return false;
  if (!MoeGemvShapeOk(mx, a.n_out, a.k)) return false;
  if (a.silu_mul && a.combine.out != nullptr) return false;
  if (a.dense_w != nullptr) {
    if (mx || !MoeGemvShapeOk(false, a.dense_n_out, a.dense_k)) return false;
    if (a.combine.out != nullptr && a.dense_n_out != a.n_out) return false;
  }
  if (mx && (a.mx_k_pad % kMoeMxfp4KPad != 0 || a.mx_k_pad < a.k)) return false;
  if (a.max_tiles == 0) return true;
  auto s = static_cast<cudaStream_t>(stream);
  if (mx) {
    moe_gemv::LaunchMxfp4(a, s);
  } else {
    a.silu_mul ? LaunchRows<true>(a, s) : LaunchRows<false>(a, s);
  }
  return true;
}

}  // namespace llm::cuda
