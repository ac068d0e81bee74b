// The MoE layer's grouped expert GEMMs on MXFP4 weights as gpt-oss checkpoints store them
// (kernels/cuda/moe/moe_ops.h, LaunchMoeGemmMxfp4): e2m1 values two per byte and one e8m0 scale
// per 32 values along k, widened to bf16 in registers (exact: a lookup of the scaled magnitudes
// by prmt, mxfp4_widen.h), then the tensor cores (mma.sync m16n8k16, bf16 in, fp32 accumulate).
//
// The operands are swapped against the bf16 kernel (moe_gemm.cu): the weights are the mma's M
// side (16 weight rows per m16 tile) and the tile's tokens its N side (8 per n8 block), so a
// decode tile of one or a few tokens fills an n8 block instead of wasting 15 of 16 M rows, and
// each widened weight fragment serves every n8 block of the tile (64 tokens in the largest
// configuration): the widening is paid once per weight and tile, not once per 16 tokens. One CTA
// (4 warps) per (tile of one expert, 64 or 128 weight rows); each warp owns 1 or 2 m16 tiles over
// the whole k extent; a multi-stage cp.async pipeline of 128-wide k slices carries the weight
// bytes (64 per row), their 4 scale bytes and the tile's activations (256 bytes per token).
//
// k order: in a 128-wide slice, thread column c (lane % 4) owns physical k 32 c .. 32 c + 31 of
// its rows (16 bytes: one scale group) and, at k16 step st, gives physical k 32 c + 4 st + {0, 1}
// as the mma's k (2c, 2c+1) and + {2, 3} as (2c+8, 2c+9), for the weights (A) and the
// activations (B) alike; the sum over k is unchanged. The activations of a token row are stored
// permuted (Mxfp4ActUnit) so that the 16-byte fragment loads are conflict-free.
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

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kBK = kMoeMxfp4KPad;  // 128 k per stage
constexpr int kWRow = kBK / 2;      // e2m1 bytes of a weight row per stage
constexpr int kSRow = kBK / 32;     // e8m0 bytes of a weight row per stage
constexpr int kXRow = kBK * 2;      // bf16 bytes of a token row per stage

// kNB n8 blocks of tokens per tile (tile rows 8 kNB), kMT m16 weight tiles per warp.
template <int kNB, int kMT, int kStagesT>
struct Cfg {
  static constexpr int kStages = kStagesT;
  static constexpr int kTok = 8 * kNB;
  static constexpr int kRows = 16 * kMT * kWarps;  // weight rows per CTA
  static constexpr int kW = kRows * kWRow, kS = kRows * kSRow, kX = kTok * kXRow;
  static constexpr int kStageBytes = kW + kS + kX;
  static constexpr int kSmem = kStages * kStageBytes;
  static constexpr int kWCopies = kW / 16 / kThreads, kXCopies = kX / 16 / kThreads;
  static_assert(kWCopies * 16 * kThreads == kW && kXCopies * 16 * kThreads == kX, "copies");
  static_assert(kW % 16 == 0 && kS % 16 == 0 && kRows <= kThreads, "stage layout");
};

template <bool kSiluMul, int kNB, int kMT, int kStages>
__global__ void __launch_bounds__(kThreads) MoeGemmMxfp4Kernel(const MoeGemmArgs a) {
  using C = Cfg<kNB, kMT, kStages>;
  ptx::GridDependencySync();  // launched with LaunchPdl
  const int tile = blockIdx.y;
  if (tile >= *a.num_tiles) return;
  const int expert = a.tiles[3 * tile], row0 = a.tiles[3 * tile + 1];
  if (expert < 0) return;  // routed experts only (no dense group)
  const int rows = min(C::kTok, a.tiles[3 * tile + 2] - row0);
  const int n_out = a.n_out;
  const int wrows = kSiluMul ? 2 * n_out : n_out;  // weight rows per expert, a multiple of 64
  const int bx = static_cast<int>(blockIdx.x);
  const int cta_row0 = bx * C::kRows;
  if (cta_row0 >= wrows) return;
  extern __shared__ __align__(128) uint8_t smem[];
  auto stage_w = [&](int s) { return smem + s * C::kStageBytes; };
  auto stage_s = [&](int s) { return smem + s * C::kStageBytes + C::kW; };
  auto stage_x = [&](int s) { return smem + s * C::kStageBytes + C::kW + C::kS; };
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int K = a.k, KP = a.mx_k_pad, KT = KP / kBK;
  // Weight row (within the expert) of CTA row r. gate_up: every m16 tile holds 8 gate rows,
  // then the 8 up rows of the same outputs, so a thread's accumulators pair gate and up.
  auto weight_row = [&](int r) -> int {
    const int gr = cta_row0 + r;
    if constexpr (!kSiluMul) {
      return gr;
    } else {
      const int j = (gr / 16) * 8 + (gr % 8);
      return (gr % 16) < 8 ? j : n_out + j;
    }
  };
  const size_t expert_row0 = static_cast<size_t>(expert) * wrows;
  const auto* wbase = static_cast<const uint8_t*>(a.w) + expert_row0 * (KP / 2);
  const uint8_t* sbase = a.mx_scales + expert_row0 * (KP / 32);

  // This thread's 16-byte copies per stage: weights (row idx / 4, quarter idx % 4), activations
  // (token idx / 16, unit idx % 16), and for tid < kRows the 4 scale bytes of weight row tid.
  // Rows past the expert's (wrows not a multiple of kRows) and tokens past the tile's are
  // zero-filled.
  const uint8_t* w_src[C::kWCopies];
  int w_dst[C::kWCopies];
  bool w_valid[C::kWCopies];
#pragma unroll
  for (int i = 0; i < C::kWCopies; ++i) {
    const int idx = tid + kThreads * i, r = idx / 4, q = idx % 4;
    w_valid[i] = cta_row0 + r < wrows;
    w_src[i] = wbase + (w_valid[i] ? static_cast<size_t>(weight_row(r)) * (KP / 2) + q * 16 : 0);
    w_dst[i] = r * kWRow + q * 16;
  }
  const bool s_valid = tid < C::kRows && cta_row0 + tid < wrows;
  const uint8_t* s_src = sbase + (s_valid ? static_cast<size_t>(weight_row(tid)) * (KP / 32) : 0);
  // Activations: the same unit q = tid % 16 of tokens tid / 16 + 8 i (one parity), so only the
  // source rows differ between the copies (-1: past the tile's tokens).
  int x_row[C::kXCopies];
  const int x_q = tid % 16, x_k = x_q * 8;
  const int x_dst = (tid / 16) * kXRow + Mxfp4ActUnit(tid / 16, x_q) * 16;
#pragma unroll
  for (int i = 0; i < C::kXCopies; ++i) {
    const int t = tid / 16 + (kThreads / 16) * i;
    x_row[i] = t < rows ? (a.sorted_token ? a.sorted_token[row0 + t] : row0 + t) : -1;
  }
  static_assert((kThreads / 16) % 2 == 0, "every copy of a thread has the same token parity");
  const auto* xbase = static_cast<const uint8_t*>(a.x);
  auto load_stage = [&](int stage, int kt) {
    const int k0 = kt * kBK;
#pragma unroll
    for (int i = 0; i < C::kWCopies; ++i) {
      ptx::CpAsync16(stage_w(stage) + w_dst[i], w_src[i] + (w_valid[i] ? kt * kWRow : 0),
                     w_valid[i]);
    }
    if (tid < C::kRows) {
      ptx::CpAsync4(stage_s(stage) + tid * kSRow, s_src + (s_valid ? kt * kSRow : 0), s_valid);
    }
    // k past K: zeros (the weights' padding is zero too, but the row may end there).
    const bool in_k = k0 + x_k < K;
#pragma unroll
    for (int i = 0; i < C::kXCopies; ++i) {
      const bool ok = x_row[i] >= 0 && in_k;
      const uint8_t* src = xbase + (ok ? (static_cast<size_t>(x_row[i]) * K + k0 + x_k) * 2 : 0);
      ptx::CpAsync16(stage_x(stage) + x_dst + i * (kThreads / 16) * kXRow, src, ok);
    }
  };

  const int g = lane / 4, c = lane % 4;
  const int nb_used = (rows + 7) / 8;  // n8 blocks holding tokens (warp-uniform)
  const bool warp_active = cta_row0 + warp * 16 * kMT < wrows;
  float acc[kMT][kNB][4] = {};
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < KT) load_stage(s, s);
    ptx::CpAsyncCommit();
  }
  for (int kt = 0; kt < KT; ++kt) {
    ptx::CpAsyncWait<kStages - 2>();
    __syncthreads();
    const int stage = kt % kStages;
    if (warp_active) {
      const uint8_t* ws = stage_w(stage);
      const uint8_t* ss = stage_s(stage);
      const uint8_t* xs = stage_x(stage);
      // Rows g and g + 8 of each m16 tile: 16 bytes (32 values, one scale group) at physical
      // k 32 c .. 32 c + 31, and the group's scale as lookup tables.
      uint32_t wv[kMT][2][4];
      Mxfp4Lut lut[kMT][2];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int r = (warp * kMT + mt) * 16 + g + 8 * hh;
          const uint4 v = *reinterpret_cast<const uint4*>(ws + r * kWRow + c * 16);
          wv[mt][hh][0] = v.x, wv[mt][hh][1] = v.y, wv[mt][hh][2] = v.z, wv[mt][hh][3] = v.w;
          lut[mt][hh] = Mxfp4MakeLut(ss[r * kSRow + c]);
        }
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        // Unit u of the thread's quarter: physical k 32 c + 8 u .. + 7 of token 8 nb + g (the
        // tokens of an n8 block share g's parity).
        uint4 xv[kNB];
        const int xoff = g * kXRow + Mxfp4ActUnit(g, 4 * c + u) * 16;
#pragma unroll
        for (int nb = 0; nb < kNB; ++nb) {
          if (nb < nb_used) xv[nb] = *reinterpret_cast<const uint4*>(xs + nb * 8 * kXRow + xoff);
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          // Step st = 2 u + h: weight values 4 st .. 4 st + 3 (nibbles 4 h .. of word u),
          // activation words 2 h (the mma's k 2c, 2c+1) and 2 h + 1 (k 2c+8, 2c+9).
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            uint32_t af[4];  // rows g, g + 8 at k (2c, 2c+1); rows g, g + 8 at k (2c+8, 2c+9)
            Mxfp4Widen4(wv[mt][0][u], h, lut[mt][0], &af[0], &af[2]);
            Mxfp4Widen4(wv[mt][1][u], h, lut[mt][1], &af[1], &af[3]);
#pragma unroll
            for (int nb = 0; nb < kNB; ++nb) {
              if (nb < nb_used) {
                const uint32_t b0 = h == 0 ? xv[nb].x : xv[nb].z;
                const uint32_t b1 = h == 0 ? xv[nb].y : xv[nb].w;
                ptx::MmaBf16(acc[mt][nb], af, b0, b1);
              }
            }
          }
        }
      }
    }
    const int next = kt + kStages - 1;
    if (next < KT) load_stage(next % kStages, next);
    ptx::CpAsyncCommit();
  }
  ptx::CpAsyncWait<0>();
  __syncthreads();  // every warp is done with the stages: the output tile reuses them

  // Accumulator (m16n8): c[0..1] weight row g, tokens 2c, 2c+1 of the n8 block; c[2..3] row
  // g + 8. The tile's outputs go through shared memory ([token][column], padded rows) so the
  // stores to out are 16-byte runs along a token's row.
  constexpr int kCols = kSiluMul ? C::kRows / 2 : C::kRows;  // output columns per CTA
  constexpr int kORow = kCols + 8;                           // bf16 per staged row
  static_assert(C::kTok * kORow * 2 <= C::kSmem, "output tile fits the stages");
  auto* ot = reinterpret_cast<__nv_bfloat16*>(smem);
  const float* bias = a.bias ? a.bias + expert_row0 : nullptr;  // [E][wrows]
  if (warp_active) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      const int tl = warp * kMT + mt;  // the CTA's m16 tile
#pragma unroll
      for (int nb = 0; nb < kNB; ++nb) {
        if (nb >= nb_used) continue;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int t = nb * 8 + 2 * c + j;
          if constexpr (kSiluMul) {
            const int col = tl * 8 + g, jg = bx * kCols + col;
            float gt = acc[mt][nb][j], up = acc[mt][nb][2 + j];
            if (bias) gt += bias[jg], up += bias[n_out + jg];
            ot[t * kORow + col] =
                __float2bfloat16_rn(MoeGateUp(gt, up, a.swiglu_limit, a.swiglu_alpha));
          } else {
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
              const int col = tl * 16 + g + 8 * hh;
              ot[t * kORow + col] = __float2bfloat16_rn(acc[mt][nb][2 * hh + j] +
                                                        (bias ? bias[cta_row0 + col] : 0.f));
            }
          }
        }
      }
    }
  }
  __syncthreads();
  // The CTA's valid columns: whole 64-row weight groups, so a multiple of 32 outputs.
  const int cols = min(kCols, (wrows - cta_row0) / (kSiluMul ? 2 : 1));
  const int chunks = cols / 8;
  auto* out = static_cast<__nv_bfloat16*>(a.out);
  for (int i = tid; i < rows * chunks; i += kThreads) {
    const int t = i / chunks, ch = i % chunks;
    *reinterpret_cast<uint4*>(out + static_cast<size_t>(row0 + t) * n_out + bx * kCols + ch * 8) =
        *reinterpret_cast<const uint4*>(ot + t * kORow + ch * 8);
  }
  if constexpr (!kSiluMul) {
    // The down GEMM of a small batch finishes the combine. Every tile takes a ticket: no dense
    // group here (expert -1 tiles returned above), as CudaMoeLayer keeps none beside MXFP4.
    if (a.combine.out != nullptr) {
      moe_combine::CombineAfterTile(a.combine, out, n_out, bx, bx * kCols, cols, *a.num_tiles);
    }
  }
}

template <bool kSiluMul, int kNB, int kMT, int kStages>
void Launch(const MoeGemmArgs& a, cudaStream_t stream) {
  using C = Cfg<kNB, kMT, kStages>;
  const int wrows = (kSiluMul ? 2 : 1) * a.n_out;
  const dim3 grid((wrows + C::kRows - 1) / C::kRows, a.max_tiles);
  auto* kernel = MoeGemmMxfp4Kernel<kSiluMul, kNB, kMT, kStages>;
  // Above 48 KB of dynamic shared memory a kernel must opt in, once (thread-safe static init).
  [[maybe_unused]] static const bool opted_in =
      C::kSmem <= 48 * 1024 ||
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem) ==
          cudaSuccess;
  (void)LaunchPdl(kernel, grid, dim3(kThreads), C::kSmem, stream, a);
}

template <bool kSiluMul>
bool LaunchFor(const MoeGemmArgs& a, cudaStream_t s) {
  switch (a.tile_rows) {
    case 16:  // decode: 64 weight rows per CTA (enough CTAs at batch 1), 8 stages: 7 in flight
      Launch<kSiluMul, 2, 1, 8>(a, s);
      return true;
    case 32:
      Launch<kSiluMul, 4, 2, 4>(a, s);
      return true;
    case 64:
      Launch<kSiluMul, 8, 2, 4>(a, s);
      return true;
    default:
      return false;
  }
}

}  // namespace

bool LaunchMoeGemmMxfp4(const MoeGemmArgs& a, void* stream) {
  if (!MoeMxfp4TileRowsOk(a.tile_rows)) return false;
  if (a.max_tiles == 0) return true;
  auto s = static_cast<cudaStream_t>(stream);
  return a.silu_mul ? LaunchFor<true>(a, s) : LaunchFor<false>(a, s);
}

}  // namespace llm::cuda
