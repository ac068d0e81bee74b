// The MXFP4 GEMVs of the MoE layer (LaunchMoeGemv, kernels/cuda/moe/moe_ops.h): one warp per CTA
// and per 8 output columns of one tile, streaming its weight rows (gate_up: the 8 gate rows and
// their 8 up rows; down: 8 rows) straight from global memory, 16 bytes (one 32-value scale group)
// per lane and row per 128-wide k slice, several slices in flight.
//
// Widening e2m1 to bf16 costs a few instructions per value; summing the products on the CUDA
// cores would add a conversion and an FMA per value and token on top, which at the copy rate is
// more than the SM can issue. So the products go through the tensor cores as in
// moe_gemm_mxfp4.cu (mma.sync m16n8k16, the weights as the M side, the tile's tokens as the N
// side, the same k permutation: thread column c owns physical k 32 c .. 32 c + 31 of each slice
// and gives k 32 c + 4 st + {0, 1} / {2, 3} at step st), with the 16 rows of the m16 tile being
// 8 gate and 8 up rows (gate_up, so a thread's accumulators pair gate and up) or 8 rows and 8
// zero rows (down). Activations come through L1 as 16-byte loads (every warp of the SM reads the
// same few token rows); up to 8 kNB tokens per pass over the weights (one pass for any tile of a
// decode batch).
//
// A warp per 16 weight rows leaves a batch-1 grid of a few warps per SM, each with one window of
// loads in flight at a time (issue, wait, widen, repeat): too few bytes in flight to stream at
// the copy rate. So kSplit warps of a CTA share its rows, warp w taking the slices w, w + kSplit,
// ...: kSplit times the loads in flight per column, and each warp's wait-then-widen rounds
// shorter. Their fp32 partial sums meet in shared memory in warp order (the same bits on every
// run) and warp 0 finishes the outputs.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/common/pdl_launch.cuh"
#include "kernels/cuda/common/ptx_ops.cuh"
#include "kernels/cuda/moe/moe_activation.cuh"
#include "kernels/cuda/moe/moe_gemv.cuh"
#include "kernels/cuda/moe/moe_ops.h"
#include "kernels/cuda/moe/mxfp4_widen.h"

namespace llm::cuda::moe_gemv {
namespace {

constexpr int kSlice = kMoeMxfp4KPad;  // 128 k: 64 value bytes and 4 scale bytes per row
static_assert(kCtaCols == 8, "one m16 tile per warp: 8 columns");

template <bool kSiluMul, int kNB, int kSplit>
__global__ void __launch_bounds__(32 * kSplit) MoeGemvMxfp4Kernel(const MoeGemmArgs a) {
  constexpr int kP = kSiluMul ? 2 : 1;  // weight rows per thread: gate and up, or one
  // Slices in flight: 8 16-byte loads per lane, 4 where four warps share a column (the CTA keeps
  // 16 per lane and column in flight, and the shorter rounds cost fewer registers).
  constexpr int kUnroll = (kSiluMul ? 4 : 8) / (kSplit >= 4 ? 2 : 1);
  constexpr int kTok = 8 * kNB;  // tokens per pass
  // Warps 1 .. kSplit - 1's accumulators, [warp][value][lane] (conflict-free).
  __shared__ float partial[kSplit > 1 ? kSplit - 1 : 1][kNB * 4][32];
  // Launched with LaunchPdl. With a.tiles_before_wait the tile list is complete already, so the
  // tile and the first round of weights are read before the wait (moe_gemv.cu's rule).
  const bool early = a.tiles_before_wait;
  if (!early) ptx::GridDependencySync();
  const int tile = blockIdx.y;
  if (tile >= __ldcg(a.num_tiles)) return;
  const int expert = __ldcg(a.tiles + 3 * tile), row0 = __ldcg(a.tiles + 3 * tile + 1);
  if (expert < 0) return;  // routed experts only (no dense group)
  const int rows = __ldcg(a.tiles + 3 * tile + 2) - row0;
  const int n_out = a.n_out, K = a.k, KP = a.mx_k_pad, KT = KP / kSlice;
  const int bx = static_cast<int>(blockIdx.x), col0 = bx * kCtaCols;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, c = lane % 4;
  if (col0 >= n_out) return;  // n_out is a multiple of 32: every column of the CTA exists
  {
    const int wrows = kP * n_out;
    // Row g of the m16 tile: gate (or down) row col0 + g; row g + 8: up row n_out + col0 + g.
    const uint8_t* wrow[kP];
    const uint8_t* srow[kP];
#pragma unroll
    for (int p = 0; p < kP; ++p) {
      const size_t r = static_cast<size_t>(expert) * wrows + col0 + g + p * n_out;
      wrow[p] = static_cast<const uint8_t*>(a.w) + r * (KP / 2) + c * 16;
      srow[p] = a.mx_scales + r * (KP / 32) + c;
    }
    // One round of this warp's slices kt0, kt0 + kSplit, ... (kUnroll of them) into (w, sc). The
    // first round (pass 0, kt0 = warp) comes before the wait where it may come early.
    uint4 w[kUnroll][kP];
    uint32_t sc[kUnroll][kP];
    auto load_round = [&](int kt0) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int kt = kt0 + u * kSplit;
        // This thread's scale group of the slice: past K (the padding) it is zero and skipped.
        const bool in_k = kt < KT && kt * kSlice + 32 * c < K;
#pragma unroll
        for (int p = 0; p < kP; ++p) {
          w[u][p] = in_k ? LoadStream16(wrow[p] + kt * (kSlice / 2)) : make_uint4(0, 0, 0, 0);
          sc[u][p] = in_k ? __ldg(srow[p] + kt * (kSlice / 32)) : 127u;
        }
      }
    };
    load_round(warp);
    if (early) ptx::GridDependencySync();
    const auto* xbase = static_cast<const __nv_bfloat16*>(a.x);
    const float* bias = a.bias ? a.bias + static_cast<size_t>(expert) * wrows : nullptr;
    auto* out = static_cast<__nv_bfloat16*>(a.out);
    for (int p0 = 0; p0 < rows; p0 += kTok) {
      const int nr = min(kTok, rows - p0);
      // Token 8 nb + g of the pass (B's column g of n8 block nb): its row of x, or null.
      const __nv_bfloat16* xr[kNB];
#pragma unroll
      for (int nb = 0; nb < kNB; ++nb) {
        const int t = 8 * nb + g;
        const int s = row0 + p0 + t;
        xr[nb] = t < nr ? xbase + static_cast<size_t>(a.sorted_token ? a.sorted_token[s] : s) * K
                        : nullptr;
      }
      float acc[kNB][4] = {};
      // This warp's slices: warp, warp + kSplit, ...; round kt0 covers kUnroll of them.
      for (int kt0 = warp; kt0 < KT; kt0 += kUnroll * kSplit) {
        if (p0 > 0 || kt0 > warp) load_round(kt0);  // the first round is in w already
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int kt = kt0 + u * kSplit;
          if (kt >= KT) break;  // warp-uniform
          const bool in_k = kt * kSlice + 32 * c < K;
          Mxfp4Lut lut[kP];
#pragma unroll
          for (int p = 0; p < kP; ++p) lut[p] = Mxfp4MakeLut(sc[u][p]);
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            // Activations k 128 kt + 32 c + 8 q .. + 7 of each n8 block's token g.
            uint4 xv[kNB];
#pragma unroll
            for (int nb = 0; nb < kNB; ++nb) {
              xv[nb] =
                  in_k && xr[nb] != nullptr
                      ? __ldg(reinterpret_cast<const uint4*>(xr[nb] + kt * kSlice + 32 * c + 8 * q))
                      : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              // Step 2 q + h: values 8 q + 4 h .. + 3 of the group (nibbles 4 h .. of word q).
              uint32_t af[4] = {0, 0, 0, 0};  // rows g, g + 8 at k (2c, 2c+1), then (2c+8, 2c+9)
              const uint32_t wq0 = q == 0   ? w[u][0].x
                                   : q == 1 ? w[u][0].y
                                   : q == 2 ? w[u][0].z
                                            : w[u][0].w;
              Mxfp4Widen4(wq0, h, lut[0], &af[0], &af[2]);
              if constexpr (kSiluMul) {
                const uint32_t wq1 = q == 0   ? w[u][1].x
                                     : q == 1 ? w[u][1].y
                                     : q == 2 ? w[u][1].z
                                              : w[u][1].w;
                Mxfp4Widen4(wq1, h, lut[1], &af[1], &af[3]);
              }
#pragma unroll
              for (int nb = 0; nb < kNB; ++nb) {
                if (8 * nb < nr) {  // warp-uniform
                  ptx::MmaBf16(acc[nb], af, h == 0 ? xv[nb].x : xv[nb].z,
                               h == 0 ? xv[nb].y : xv[nb].w);
                }
              }
            }
          }
        }
      }
      if constexpr (kSplit > 1) {
        // The warps' partial sums into warp 0's, in warp order.
        if (warp > 0) {
#pragma unroll
          for (int nb = 0; nb < kNB; ++nb) {
#pragma unroll
            for (int j = 0; j < 4; ++j) partial[warp - 1][4 * nb + j][lane] = acc[nb][j];
          }
        }
        __syncthreads();
        if (warp == 0) {
#pragma unroll
          for (int w1 = 0; w1 < kSplit - 1; ++w1) {
#pragma unroll
            for (int nb = 0; nb < kNB; ++nb) {
#pragma unroll
              for (int j = 0; j < 4; ++j) acc[nb][j] += partial[w1][4 * nb + j][lane];
            }
          }
        }
        __syncthreads();  // partial free for the next pass
      }
      if (warp != 0) continue;
      // Accumulator (m16n8): c[0..1] weight row g at tokens 2c, 2c+1 of the n8 block; c[2..3]
      // row g + 8 (gate_up: the up row of the same column).
      const int col = col0 + g;
#pragma unroll
      for (int nb = 0; nb < kNB; ++nb) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int t = 8 * nb + 2 * c + j;
          if (t >= nr) continue;
          float y;
          if constexpr (kSiluMul) {
            float gt = acc[nb][j], up = acc[nb][2 + j];
            if (bias) gt += bias[col], up += bias[n_out + col];
            y = MoeGateUp(gt, up, a.swiglu_limit, a.swiglu_alpha);
          } else {
            y = acc[nb][j] + (bias ? bias[col] : 0.f);
          }
          out[static_cast<size_t>(row0 + p0 + t) * n_out + col] = __float2bfloat16_rn(y);
        }
      }
    }
  }
  if constexpr (!kSiluMul) {
    if (a.combine.out != nullptr) CombineAfterCta(a, col0, kCtaCols);
  }
}

template <bool kSiluMul, int kNB, int kSplit>
void Launch(const MoeGemmArgs& a, cudaStream_t stream) {
  const dim3 grid(a.n_out / kCtaCols, a.max_tiles);
  (void)LaunchPdl(MoeGemvMxfp4Kernel<kSiluMul, kNB, kSplit>, grid, dim3(32 * kSplit), 0, stream, a);
}

template <bool kSiluMul, int kNB>
void LaunchSplit(const MoeGemmArgs& a, cudaStream_t stream) {
  const int split =
      a.gemv_split_k > 0 ? a.gemv_split_k : MoeGemvMxfp4DefaultSplitK(a.gemv_max_rows);
  if (split >= 4) {
    Launch<kSiluMul, kNB, 4>(a, stream);
  } else if (split >= 2) {
    Launch<kSiluMul, kNB, 2>(a, stream);
  } else {
    Launch<kSiluMul, kNB, 1>(a, stream);
  }
}

}  // namespace

void LaunchMxfp4(const MoeGemmArgs& a, cudaStream_t stream) {
  // 8 tokens per pass for the layer's decode batches up to 8 tokens, else 16.
  const bool one_block = a.gemv_max_rows > 0 && a.gemv_max_rows <= 8;
  if (a.silu_mul) {
    one_block ? LaunchSplit<true, 1>(a, stream) : LaunchSplit<true, 2>(a, stream);
  } else {
    one_block ? LaunchSplit<false, 1>(a, stream) : LaunchSplit<false, 2>(a, stream);
  }
}

}  // namespace llm::cuda::moe_gemv
