// The MoE layer's grouped expert GEMMs as GEMVs for decode batches (kernels/cuda/moe/moe_ops.h,
// LaunchMoeGemv): bf16 or MXFP4 weights, the same tiles, gather, biases, gates, dense group and
// fused combine as LaunchMoeGemm / LaunchMoeGemmMxfp4.
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
#include "kernels/cuda/moe/moe_combine.cuh"
#include "kernels/cuda/moe/moe_ops.h"
#include "kernels/cuda/moe/mxfp4_widen.h"

namespace llm::cuda {
namespace {

constexpr int kWarps = 8;  // output columns per CTA
constexpr int kThreads = 32 * kWarps;
constexpr int kUnroll = 4;  // 16-byte weight loads in flight per lane and weight row
static_assert(kMoeGemvColumnBlock % kWarps == 0, "a combine column block is whole CTAs");

// 16 weight bytes, read once: not kept in L1 (the token rows are).
__device__ __forceinline__ uint4 LoadStream16(const uint4* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

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

// kMx: MXFP4 weights (values [E, wrows, mx_k_pad / 2], scales [E, wrows, mx_k_pad / 32]), else
// bf16 [E, wrows, k]. A chunk is one 16-byte weight load: 8 bf16, or 32 e2m1 values (one scale
// group). kR token rows per pass.
template <bool kMx, bool kSiluMul, int kR>
__global__ void __launch_bounds__(kThreads) MoeGemvKernel(const MoeGemmArgs a) {
  constexpr int kP = kSiluMul ? 2 : 1;  // weight rows per warp: gate and up, or one
  ptx::GridDependencySync();            // launched with LaunchPdl
  const int tile = blockIdx.y;
  if (tile >= *a.num_tiles) return;
  const int expert = a.tiles[3 * tile], row0 = a.tiles[3 * tile + 1];
  const int rows = a.tiles[3 * tile + 2] - row0;
  const bool dense = expert < 0;  // the shared experts' group (bf16 only)
  if (kMx && dense) return;
  const int n_out = dense ? a.dense_n_out : a.n_out;
  const int bx = static_cast<int>(blockIdx.x);
  if (bx * kWarps >= n_out) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int col = bx * kWarps + warp;  // this warp's output column
  auto* out = static_cast<__nv_bfloat16*>(dense ? a.dense_out : a.out);
  if (col < n_out) {
    const int K = dense ? a.dense_k : a.k;
    const int wrows = kP * n_out;
    // Weight rows of this warp (gate col, up n_out + col; or col) and their chunks.
    const uint4* wrow[kP];
    const uint8_t* srow[kP] = {};
    int chunks;
    if constexpr (kMx) {
      const int KP = a.mx_k_pad;
      chunks = K / 32;  // the padding past K is zero: not read
#pragma unroll
      for (int p = 0; p < kP; ++p) {
        const size_t r = static_cast<size_t>(expert) * wrows + col + p * n_out;
        wrow[p] = reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(a.w) + r * (KP / 2));
        srow[p] = a.mx_scales + r * (KP / 32);
      }
    } else {
      chunks = K / 8;
      const auto* wbase = static_cast<const uint16_t*>(dense ? a.dense_w : a.w);
#pragma unroll
      for (int p = 0; p < kP; ++p) {
        const size_t r = (dense ? 0 : static_cast<size_t>(expert) * wrows) + col + p * n_out;
        wrow[p] = reinterpret_cast<const uint4*>(wbase + r * K);
      }
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
        [[maybe_unused]] uint32_t sc[kUnroll][kP];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int c = c0 + 32 * u;
          if (c < chunks) {
#pragma unroll
            for (int p = 0; p < kP; ++p) {
              w[u][p] = LoadStream16(wrow[p] + c);
              if constexpr (kMx) sc[u][p] = __ldg(srow[p] + c);
            }
          }
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int c = c0 + 32 * u;
          if (c >= chunks) continue;
          if constexpr (kMx) {
            Mxfp4Lut lut[kP];
#pragma unroll
            for (int p = 0; p < kP; ++p) lut[p] = Mxfp4MakeLut(sc[u][p]);
              // Word q of the chunk: values 32 c + 8 q .. + 7 (the low nibble first), against
              // the token row's 16-byte unit 4 c + q.
#pragma unroll
            for (int q = 0; q < 4; ++q) {
              float wf[kP][8];
#pragma unroll
              for (int p = 0; p < kP; ++p) {
                const uint32_t wq = q == 0   ? w[u][p].x
                                    : q == 1 ? w[u][p].y
                                    : q == 2 ? w[u][p].z
                                             : w[u][p].w;
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                  uint32_t lo, hi;
                  Mxfp4Widen4(wq, h, lut[p], &lo, &hi);
                  const float2 a01 = Bf16x2ToFloat2(lo), a23 = Bf16x2ToFloat2(hi);
                  wf[p][4 * h] = a01.x, wf[p][4 * h + 1] = a01.y;
                  wf[p][4 * h + 2] = a23.x, wf[p][4 * h + 3] = a23.y;
                }
              }
#pragma unroll
              for (int r = 0; r < kR; ++r) {
                if (r < nr) {
                  const uint4 xv = __ldg(xr[r] + 4 * c + q);
#pragma unroll
                  for (int p = 0; p < kP; ++p) acc[p][r] = Dot8(wf[p], xv, acc[p][r]);
                }
              }
            }
          } else {
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
    // The down GEMM of a small batch finishes the combine: the kMoeGemvColumnBlock /
    // kWarps CTAs of every tile in a column block draw its ticket, and the last one combines the
    // block's columns (moe_combine.cuh: the same bits as LaunchMoeCombine).
    if (a.combine.out != nullptr) {
      constexpr int kCtasPerBlock = kMoeGemvColumnBlock / kWarps;
      const int block = bx / kCtasPerBlock;
      moe_combine::CombineAfterTile(a.combine, static_cast<const __nv_bfloat16*>(a.out), a.n_out,
                                    block, block * kMoeGemvColumnBlock, kMoeGemvColumnBlock,
                                    *a.num_tiles * kCtasPerBlock);
    }
  }
}

template <bool kMx, bool kSiluMul, int kR>
void Launch(const MoeGemmArgs& a, cudaStream_t stream) {
  const int n = !kMx && a.dense_w != nullptr && a.dense_n_out > a.n_out ? a.dense_n_out : a.n_out;
  const dim3 grid((n + kWarps - 1) / kWarps, a.max_tiles);
  (void)LaunchPdl(MoeGemvKernel<kMx, kSiluMul, kR>, grid, dim3(kThreads), 0, stream, a);
}

template <bool kMx, bool kSiluMul>
void LaunchRows(const MoeGemmArgs& a, cudaStream_t stream) {
  const int bound = a.gemv_max_rows > 0 ? a.gemv_max_rows : kMoeTileRows;
  if (bound <= 1) {
    Launch<kMx, kSiluMul, 1>(a, stream);
  } else if (bound <= 4) {
    Launch<kMx, kSiluMul, 4>(a, stream);
  } else {
    Launch<kMx, kSiluMul, 16>(a, stream);
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
    a.silu_mul ? LaunchRows<true, true>(a, s) : LaunchRows<true, false>(a, s);
  } else {
    a.silu_mul ? LaunchRows<false, true>(a, s) : LaunchRows<false, false>(a, s);
  }
  return true;
}

}  // namespace llm::cuda
