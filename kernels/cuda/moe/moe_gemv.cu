// The MoE layer's grouped expert GEMMs as GEMVs for decode batches (kernels/cuda/moe/moe_ops.h,
// LaunchMoeGemv) on bf16 or fp8 e4m3 weights (MoeGemmScales: per tensor, expert, row or 128x128
// block): the same tiles, gather, biases, gates, dense group and fused combine as LaunchMoeGemm.
// The MXFP4 form is moe_gemv_mxfp4.cu's (through the tensor cores).
//
// With one to a few rows per expert the step is a pure weight stream, and the tiled kernels'
// fat CTAs (64 weight rows x the whole k through a shared-memory ring) leave a batch-1 grid of
// one or two waves whose last is ragged, each CTA paying its pipeline's ramp. Here a warp owns
// one output column of one tile (gate_up: the gate row and its up row; down: one row, or four
// for bf16 at batch 1, where a column's row is a round or two of loads) over the whole k; its lanes
// read 16-byte runs straight from global memory past L1 (kUnroll per lane and weight row issued
// before any is used), so a CTA of 8 warps is small, many fit on an SM and the bytes in flight come
// from occupancy. The tile's token rows are read through L1 (read-only): every warp of the SM reads
// the same few rows. Each weight is read once per pass over the tile's rows (kR rows per pass, from
// MoeGemmArgs::gemv_max_rows: one pass for a tile of up to 8 rows), products are summed in fp32 per
// lane and across the warp by shuffles, and the output rounded to bf16 once at the store.
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
constexpr int kWarps = moe_gemv::kCtaCols;  // warps per CTA
constexpr int kThreads = 32 * kWarps;
constexpr int kUnroll = 4;  // 16-byte weight loads in flight per lane and weight row (kU)

using ptx::Bf16x2ToFloat2;

// acc + w[0..7] . (the 8 bf16 of xv), in k order.
__device__ __forceinline__ float Dot8(const float* w, const uint4& xv, float acc) {
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

// The weights' form: bf16, or e4m3 with one scale per expert / tensor / weight row (applied to
// the sum) or per 128x128 block (applied to each 16-value chunk's partial sum: a chunk lies in one
// 128-wide k block).
enum class WForm { kBf16, kFp8, kFp8Block };

// Weights [E, wrows, k] (the dense group's [wrows, dense_k]); a chunk is one 16-byte weight load
// (8 bf16 or 16 e4m3 values). kR token rows per pass; kC output columns per warp (kC > 1: the
// down GEMV of short rows, whose CTAs would each read a few KB and pay their tile read, fence and
// ticket for it; with four columns a CTA is one combine block of a tile); kU 16-byte loads in
// flight per lane and weight row.
template <WForm kForm, bool kSiluMul, int kR, int kC, int kU>
__global__ void __launch_bounds__(kThreads) MoeGemvKernel(const MoeGemmArgs a) {
  constexpr bool kFp8 = kForm != WForm::kBf16, kBlock = kForm == WForm::kFp8Block;
  constexpr int kP = kSiluMul ? 2 : 1;    // weight rows per column: gate and up, or one
  constexpr int kValues = kFp8 ? 16 : 8;  // per chunk
  constexpr int kCols = kWarps * kC;      // output columns per CTA
  static_assert(kC == 1 || !kSiluMul, "gate_up keeps a column per warp");
  static_assert(kMoeGemvColumnBlock % kCols == 0, "a combine block is whole CTAs");
  // Launched with LaunchPdl. With a.tiles_before_wait the tile list is complete already (written
  // before the kernel ahead of this one), so the tile and the first round of weights are read
  // before the wait, while that kernel finishes; x only after it.
  const bool early = a.tiles_before_wait;
  if (!early) ptx::GridDependencySync();
  const int tile = blockIdx.y;
  if (tile >= __ldcg(a.num_tiles)) return;
  const int expert = __ldcg(a.tiles + 3 * tile), row0 = __ldcg(a.tiles + 3 * tile + 1);
  const int rows = __ldcg(a.tiles + 3 * tile + 2) - row0;
  const bool dense = expert < 0;  // the shared experts' group
  const int n_out = dense ? a.dense_n_out : a.n_out;
  const int col0 = static_cast<int>(blockIdx.x) * kCols;
  if (col0 >= n_out) return;  // the wider group's columns (never with a combine)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  auto* out = static_cast<__nv_bfloat16*>(dense ? a.dense_out : a.out);
  // This warp's columns: col0 + kWarps j + warp (n_out is a multiple of 32, so with kC > 1 every
  // one exists). live: warp-uniform; every warp of the CTA reaches the wait.
  const int wcol0 = col0 + warp;
  const bool live = wcol0 < n_out;
  {
    const int K = dense ? a.dense_k : a.k, chunks = K / kValues;
    const int wrows = kP * n_out;
    // Weight rows of this warp: gate col and up n_out + col, or col (within the expert).
    const uint4* wrow[kC][kP];
    const auto* wbase = static_cast<const uint8_t*>(dense ? a.dense_w : a.w);
#pragma unroll
    for (int j = 0; j < kC; ++j) {
#pragma unroll
      for (int p = 0; p < kP; ++p) {
        const int col = live ? wcol0 + kWarps * j : 0;
        const size_t r = (dense ? 0 : static_cast<size_t>(expert) * wrows) + col + p * n_out;
        wrow[j][p] = reinterpret_cast<const uint4*>(wbase + r * K * (kFp8 ? 1 : 2));
      }
    }
    // fp8: each weight row's scale (or its row of 128x128 block scales), MoeGemmScales' layout.
    [[maybe_unused]] float row_scale[kC][kP];
    [[maybe_unused]] const float* block_scale[kC][kP];
    if constexpr (kFp8) {
      const MoeGemmScales& sc = dense ? a.dense_w_scale : a.w_scale;
      const float* base = sc.scale + (dense ? 0 : static_cast<size_t>(expert) * sc.expert_stride);
#pragma unroll
      for (int j = 0; j < kC; ++j) {
#pragma unroll
        for (int p = 0; p < kP; ++p) {
          const int r = (live ? wcol0 + kWarps * j : 0) + p * n_out;
          if constexpr (kBlock) {
            block_scale[j][p] = base + static_cast<size_t>(r / 128) * sc.block_ld;
          } else {
            row_scale[j][p] = base[static_cast<size_t>(r) * sc.row_stride];
          }
        }
      }
    }
    // The first round of weights (pass 0, c0 = lane): before the wait where it may come early.
    uint4 w[kU][kC][kP];
    auto load_round = [&](int c0) {
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int c = c0 + 32 * u;
#pragma unroll
        for (int j = 0; j < kC; ++j) {
#pragma unroll
          for (int p = 0; p < kP; ++p) {
            if (c < chunks) w[u][j][p] = LoadStream16(wrow[j][p] + c);
          }
        }
      }
    };
    if (live) load_round(lane);
    if (early) ptx::GridDependencySync();
    if (live) {
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
        float acc[kC][kP][kR] = {};
        for (int c0 = lane; c0 < chunks; c0 += 32 * kU) {
          if (p0 > 0 || c0 > lane) load_round(c0);  // the first round is in w already
#pragma unroll
          for (int u = 0; u < kU; ++u) {
            const int c = c0 + 32 * u;
            if (c >= chunks) continue;
            // The token rows' 16-byte units of chunk c (two per fp8 chunk), shared by the columns.
            uint4 xv[kR][kFp8 ? 2 : 1];
#pragma unroll
            for (int r = 0; r < kR; ++r) {
              if (r < nr) {
                if constexpr (kFp8) {
                  xv[r][0] = __ldg(xr[r] + 2 * c), xv[r][1] = __ldg(xr[r] + 2 * c + 1);
                } else {
                  xv[r][0] = __ldg(xr[r] + c);
                }
              }
            }
#pragma unroll
            for (int j = 0; j < kC; ++j) {
              float wf[kP][kValues];
              [[maybe_unused]] float bs[kP];
#pragma unroll
              for (int p = 0; p < kP; ++p) {
                const uint4& wv = w[u][j][p];
                const uint32_t ww[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                  if constexpr (kFp8) {
                    uint32_t lo, hi;  // values 4 i, 4 i + 1 and 4 i + 2, 4 i + 3 (exact)
                    ptx::E4m3x4ToBf16x4(ww[i], &lo, &hi);
                    const float2 f0 = Bf16x2ToFloat2(lo), f1 = Bf16x2ToFloat2(hi);
                    wf[p][4 * i] = f0.x, wf[p][4 * i + 1] = f0.y;
                    wf[p][4 * i + 2] = f1.x, wf[p][4 * i + 3] = f1.y;
                  } else {
                    const float2 f = Bf16x2ToFloat2(ww[i]);
                    wf[p][2 * i] = f.x, wf[p][2 * i + 1] = f.y;
                  }
                }
                if constexpr (kBlock) bs[p] = __ldg(block_scale[j][p] + c * kValues / 128);
              }
#pragma unroll
              for (int r = 0; r < kR; ++r) {
                if (r < nr) {
#pragma unroll
                  for (int p = 0; p < kP; ++p) {
                    float& ac = acc[j][p][r];
                    if constexpr (kBlock) {
                      ac = fmaf(Dot8(wf[p] + 8, xv[r][1], Dot8(wf[p], xv[r][0], 0.f)), bs[p], ac);
                    } else if constexpr (kFp8) {
                      ac = Dot8(wf[p] + 8, xv[r][1], Dot8(wf[p], xv[r][0], ac));
                    } else {
                      ac = Dot8(wf[p], xv[r][0], ac);
                    }
                  }
                }
              }
            }
          }
        }
        // Every lane gets the sums; lane r % 32 stores row r.
#pragma unroll
        for (int j = 0; j < kC; ++j) {
          const int col = wcol0 + kWarps * j;
#pragma unroll
          for (int r = 0; r < kR; ++r) {
            if (r >= nr) break;  // warp-uniform
            float v[kP];
#pragma unroll
            for (int p = 0; p < kP; ++p) {
              v[p] = WarpSum(acc[j][p][r]);
              if constexpr (kFp8 && !kBlock) v[p] *= row_scale[j][p];
            }
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
    }
  }
  if constexpr (!kSiluMul) {
    if (a.combine.out != nullptr) moe_gemv::CombineAfterCta(a, col0, kCols);
  }
}

template <WForm kForm, bool kSiluMul, int kR, int kC, int kU>
void Launch(const MoeGemmArgs& a, cudaStream_t stream) {
  const int n = a.dense_w != nullptr && a.dense_n_out > a.n_out ? a.dense_n_out : a.n_out;
  const dim3 grid(n / (kWarps * kC), a.max_tiles);
  (void)LaunchPdl(MoeGemvKernel<kForm, kSiluMul, kR, kC, kU>, grid, dim3(kThreads), 0, stream, a);
}

// The rows per pass: the bound rounded up to a power of two, at most 8 (a tile of more rows,
// rare at the batches MoeGemvBatchOk admits, takes two passes: more accumulators would cost
// occupancy on every tile). One row per tile (batch 1) on a bf16 down GEMV takes four columns
// per warp, two loads each in flight per lane (eight, against the one-column form's four); the
// fp8 forms keep a column per warp (the four-column block-scaled form spills, and neither is
// measured yet).
template <WForm kForm, bool kSiluMul>
void LaunchRows(const MoeGemmArgs& a, cudaStream_t stream) {
  const int bound = a.gemv_max_rows > 0 ? a.gemv_max_rows : kMoeTileRows;
  if (bound <= 1) {
    if constexpr (!kSiluMul && kForm == WForm::kBf16) {
      Launch<kForm, kSiluMul, 1, 4, 2>(a, stream);
    } else {
      Launch<kForm, kSiluMul, 1, 1, kUnroll>(a, stream);
    }
  } else if (bound <= 2) {
    Launch<kForm, kSiluMul, 2, 1, kUnroll>(a, stream);
  } else if (bound <= 4) {
    Launch<kForm, kSiluMul, 4, 1, kUnroll>(a, stream);
  } else {
    Launch<kForm, kSiluMul, 8, 1, kUnroll>(a, stream);
  }
}

template <WForm kForm>
void LaunchForm(const MoeGemmArgs& a, cudaStream_t stream) {
  a.silu_mul ? LaunchRows<kForm, true>(a, stream) : LaunchRows<kForm, false>(a, stream);
}

}  // namespace

bool LaunchMoeGemv(const MoeGemmArgs& a, void* stream) {
  const MoeGemvWeights form = a.mx_scales != nullptr ? MoeGemvWeights::kMxfp4
                              : a.fp8                ? MoeGemvWeights::kFp8
                                                     : MoeGemvWeights::kBf16;
  const bool mx = form == MoeGemvWeights::kMxfp4;
  if (a.x_scale != nullptr || (mx && a.fp8)) return false;
  if (!MoeGemvShapeOk(form, a.n_out, a.k)) return false;
  if (a.silu_mul && a.combine.out != nullptr) return false;
  if (a.dense_w != nullptr) {
    if (mx || !MoeGemvShapeOk(form, a.dense_n_out, a.dense_k)) return false;
    if (a.combine.out != nullptr && a.dense_n_out != a.n_out) return false;
  }
  if (mx && (a.mx_k_pad % kMoeMxfp4KPad != 0 || a.mx_k_pad < a.k)) return false;
  if (a.fp8 && a.w_scale.scale == nullptr) return false;
  if (a.fp8 && a.dense_w != nullptr && a.dense_w_scale.scale == nullptr) return false;
  if (a.max_tiles == 0) return true;
  auto s = static_cast<cudaStream_t>(stream);
  if (mx) {
    moe_gemv::LaunchMxfp4(a, s);
  } else if (a.fp8 && a.w_scale.block_ld > 0) {
    LaunchForm<WForm::kFp8Block>(a, s);
  } else if (a.fp8) {
    LaunchForm<WForm::kFp8>(a, s);
  } else {
    LaunchForm<WForm::kBf16>(a, s);
  }
  return true;
}

}  // namespace llm::cuda
