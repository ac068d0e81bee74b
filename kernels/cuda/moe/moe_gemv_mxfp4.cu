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

// One 128-wide k slice kt of the thread's weight rows (w[p]: its 16 value bytes of gate / down
// row p, sc[p] its scale byte) times the pass's tokens (xr[nb]: token 8 nb + g's row of x, or
// null), added to acc. Thread column c's scale group past K (the padding) reads no activations.
template <bool kSiluMul, int kNB>
__device__ __forceinline__ void SliceMma(const uint4 (&w)[kSiluMul ? 2 : 1],
                                         const uint32_t (&sc)[kSiluMul ? 2 : 1],
                                         const __nv_bfloat16* const (&xr)[kNB], int kt, int c,
                                         int K, int nr, float (&acc)[kNB][4]) {
  constexpr int kP = kSiluMul ? 2 : 1;
  const bool in_k = kt * kSlice + 32 * c < K;
  Mxfp4Lut lut[kP];
#pragma unroll
  for (int p = 0; p < kP; ++p) lut[p] = Mxfp4MakeLut(sc[p]);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    // Activations k 128 kt + 32 c + 8 q .. + 7 of each n8 block's token g.
    uint4 xv[kNB];
#pragma unroll
    for (int nb = 0; nb < kNB; ++nb) {
      xv[nb] = in_k && xr[nb] != nullptr
                   ? __ldg(reinterpret_cast<const uint4*>(xr[nb] + kt * kSlice + 32 * c + 8 * q))
                   : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      // Step 2 q + h: values 8 q + 4 h .. + 3 of the group (nibbles 4 h .. of word q).
      uint32_t af[4] = {0, 0, 0, 0};  // rows g, g + 8 at k (2c, 2c+1), then (2c+8, 2c+9)
      const uint32_t wq0 = q == 0 ? w[0].x : q == 1 ? w[0].y : q == 2 ? w[0].z : w[0].w;
      Mxfp4Widen4(wq0, h, lut[0], &af[0], &af[2]);
      if constexpr (kSiluMul) {
        const uint32_t wq1 = q == 0 ? w[1].x : q == 1 ? w[1].y : q == 2 ? w[1].z : w[1].w;
        Mxfp4Widen4(wq1, h, lut[1], &af[1], &af[3]);
      }
#pragma unroll
      for (int nb = 0; nb < kNB; ++nb) {
        if (8 * nb < nr) {  // warp-uniform
          ptx::MmaBf16(acc[nb], af, h == 0 ? xv[nb].x : xv[nb].z, h == 0 ? xv[nb].y : xv[nb].w);
        }
      }
    }
  }
}

// kStages > 0: each warp streams its slices through a ring of kStages slices in shared memory
// (cp.async, kStages - 1 in flight while it computes one); 0: through registers, kUnroll slices
// per round.
template <bool kSiluMul, int kNB, int kSplit, int kStages>
__global__ void __launch_bounds__(32 * kSplit) MoeGemvMxfp4Kernel(const MoeGemmArgs a) {
  constexpr int kP = kSiluMul ? 2 : 1;  // weight rows per thread: gate and up, or one
  // Slices in flight: 8 16-byte loads per lane, 4 where four warps share a column (the CTA keeps
  // 16 per lane and column in flight, and the shorter rounds cost fewer registers).
  constexpr int kUnroll = (kSiluMul ? 4 : 8) / (kSplit >= 4 ? 2 : 1);
  constexpr int kTok = 8 * kNB;  // tokens per pass
  // Warps 1 .. kSplit - 1's accumulators, [warp][value][lane] (conflict-free).
  __shared__ float partial[kSplit > 1 ? kSplit - 1 : 1][kNB * 4][32];
  // One slice of a warp's rows: lane (g, c)'s 16 value bytes of row g (+ 8), then the 4 scale
  // bytes (c = 0..3) of each row g.
  struct Stage {
    uint4 w[kP][32];
    uint32_t s[kP][8];
  };
  __shared__ Stage ring[kStages > 0 ? kSplit : 1][kStages > 0 ? kStages : 1];
  ptx::GridDependencySync();  // launched with LaunchPdl
  const int tile = blockIdx.y;
  if (tile >= *a.num_tiles) return;
  const int expert = a.tiles[3 * tile], row0 = a.tiles[3 * tile + 1];
  if (expert < 0) return;  // routed experts only (no dense group)
  const int rows = a.tiles[3 * tile + 2] - row0;
  const int n_out = a.n_out, K = a.k, KP = a.mx_k_pad, KT = KP / kSlice;
  const int bx = static_cast<int>(blockIdx.x), col0 = bx * kCtaCols;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, c = lane % 4;
  if (col0 < n_out) {  // n_out is a multiple of 32: every column of the CTA exists
    const int wrows = kP * n_out;
    // Row g of the m16 tile: gate (or down) row col0 + g; row g + 8: up row n_out + col0 + g.
    const uint8_t* wrow[kP];
    const uint8_t* srow[kP];  // the row's scale bytes (4-byte aligned: KP is a multiple of 128)
#pragma unroll
    for (int p = 0; p < kP; ++p) {
      const size_t r = static_cast<size_t>(expert) * wrows + col0 + g + p * n_out;
      wrow[p] = static_cast<const uint8_t*>(a.w) + r * (KP / 2) + c * 16;
      srow[p] = a.mx_scales + r * (KP / 32);
    }
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
      if constexpr (kStages > 0) {
        // This warp's slices warp + i kSplit, i < nw, through its ring: slice i + kStages - 1 is
        // issued before slice i is used (empty groups past the end keep the count).
        const int nw = warp < KT ? (KT - 1 - warp) / kSplit + 1 : 0;
        Stage* my = ring[warp];
        auto issue = [&](int i) {
          if (i < nw) {
            const int kt = warp + i * kSplit;
            Stage& st = my[i % kStages];
            // Past K (the padding) the values are zero-filled, not read.
            const bool in_k = kt * kSlice + 32 * c < K;
#pragma unroll
            for (int p = 0; p < kP; ++p) {
              ptx::CpAsync16(&st.w[p][lane], wrow[p] + kt * (kSlice / 2), in_k);
              if (c == 0) ptx::CpAsync4(&st.s[p][g], srow[p] + kt * (kSlice / 32), true);
            }
          }
          ptx::CpAsyncCommit();
        };
#pragma unroll
        for (int i = 0; i < kStages - 1; ++i) issue(i);
        for (int i = 0; i < nw; ++i) {
          issue(i + kStages - 1);
          ptx::CpAsyncWait<kStages - 1>();  // slice i has landed (groups complete in order)
          __syncwarp();                     // and the other lanes' scale words with it
          const Stage& st = my[i % kStages];
          uint4 w[kP];
          uint32_t sc[kP];
#pragma unroll
          for (int p = 0; p < kP; ++p) {
            w[p] = st.w[p][lane];
            sc[p] = (st.s[p][g] >> (8 * c)) & 0xFFu;
          }
          SliceMma<kSiluMul, kNB>(w, sc, xr, warp + i * kSplit, c, K, nr, acc);
          __syncwarp();  // every lane has read the stage before the next issue refills it
        }
      } else {
        // This warp's slices: warp, warp + kSplit, ...; round kt0 covers kUnroll of them.
        for (int kt0 = warp; kt0 < KT; kt0 += kUnroll * kSplit) {
          uint4 w[kUnroll][kP];
          uint32_t sc[kUnroll][kP];
#pragma unroll
          for (int u = 0; u < kUnroll; ++u) {
            const int kt = kt0 + u * kSplit;
            // This thread's scale group of the slice: past K (the padding) it is zero, skipped.
            const bool in_k = kt < KT && kt * kSlice + 32 * c < K;
#pragma unroll
            for (int p = 0; p < kP; ++p) {
              w[u][p] = in_k ? LoadStream16(wrow[p] + kt * (kSlice / 2)) : make_uint4(0, 0, 0, 0);
              sc[u][p] = in_k ? __ldg(srow[p] + kt * (kSlice / 32) + c) : 127u;
            }
          }
#pragma unroll
          for (int u = 0; u < kUnroll; ++u) {
            const int kt = kt0 + u * kSplit;
            if (kt >= KT) break;  // warp-uniform
            SliceMma<kSiluMul, kNB>(w[u], sc[u], xr, kt, c, K, nr, acc);
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
    if (a.combine.out != nullptr) CombineAfterCta(a, bx);
  }
}

template <bool kSiluMul, int kNB, int kSplit, int kStages>
void Launch(const MoeGemmArgs& a, cudaStream_t stream) {
  const dim3 grid(a.n_out / kCtaCols, a.max_tiles);
  (void)LaunchPdl(MoeGemvMxfp4Kernel<kSiluMul, kNB, kSplit, kStages>, grid, dim3(32 * kSplit), 0,
                  stream, a);
}

template <bool kSiluMul, int kNB, int kStages>
void LaunchSplit(const MoeGemmArgs& a, cudaStream_t stream) {
  const int split =
      a.gemv_split_k > 0 ? a.gemv_split_k : MoeGemvMxfp4DefaultSplitK(a.gemv_max_rows);
  if (split >= 4) {
    Launch<kSiluMul, kNB, 4, kStages>(a, stream);
  } else if (split >= 2) {
    Launch<kSiluMul, kNB, 2, kStages>(a, stream);
  } else {
    Launch<kSiluMul, kNB, 1, kStages>(a, stream);
  }
}

template <bool kSiluMul, int kNB>
void LaunchStages(const MoeGemmArgs& a, cudaStream_t stream) {
  const int stages = a.gemv_stages != 0 ? a.gemv_stages : MoeGemvMxfp4DefaultStages(a.silu_mul);
  if (stages < 0) {
    LaunchSplit<kSiluMul, kNB, 0>(a, stream);
  } else if (stages <= 4) {
    LaunchSplit<kSiluMul, kNB, 4>(a, stream);
  } else {
    LaunchSplit<kSiluMul, kNB, 8>(a, stream);
  }
}

}  // namespace

void LaunchMxfp4(const MoeGemmArgs& a, cudaStream_t stream) {
  // 8 tokens per pass for the layer's decode batches up to 8 tokens, else 16.
  const bool one_block = a.gemv_max_rows > 0 && a.gemv_max_rows <= 8;
  if (a.silu_mul) {
    one_block ? LaunchStages<true, 1>(a, stream) : LaunchStages<true, 2>(a, stream);
  } else {
    one_block ? LaunchStages<false, 1>(a, stream) : LaunchStages<false, 2>(a, stream);
  }
}

}  // namespace llm::cuda::moe_gemv
