// The MoE layer's grouped expert GEMMs with fp8 e4m3 weights and fp8 e4m3 activations on the
// e4m3 tensor cores (kernels/cuda/moe/moe_ops.h, LaunchMoeGemmW8a8): mma.sync m16n8k32 e4m3 x
// e4m3 -> fp32 (sm_89 on; an older binary of this kernel traps, so MoeW8a8Available asks which
// binary the device runs).
//
// The layout follows the MXFP4 kernel (moe_gemm_mxfp4.cu): the weights are the mma's M side (16
// weight rows per m16 tile, the checkpoint's e4m3 bytes as stored) and the tile's tokens its N
// side (8 per n8 block), so a decode tile of one or a few tokens fills an n8 block and every
// weight fragment serves every n8 block of the tile. One CTA (4 warps) per (tile of one expert
// or of the dense group, 64 or 128 weight rows); each warp owns 1 or 2 m16 tiles over the whole
// k extent; a multi-stage cp.async pipeline of 128-wide k slices carries 128 weight bytes per
// row, 128 activation bytes per token and, with 128x128 block scales, the slice's weight and
// activation scales. Nothing is widened: a stage's bytes go to the tensor cores as loaded.
//
// Scales: each 128-wide k slice's tensor-core sums go into an fp32 running total (the tensor
// cores' own fp8 accumulation is narrower than fp32 on Hopper: it never spans more than 128
// products). Block-scaled weights (DeepSeek-V3) pair with activations quantized per token and
// 128-wide k group (one scale per slice and token), and each slice's sums are scaled by both on
// the way into the total; per-row and per-tensor weight scales pair with one activation scale
// per token, applied once in the epilogue.
//
// k order: in a 128-wide slice, thread column c (lane % 4) owns physical k 32 c .. 32 c + 31 of
// its rows and tokens (two 16-byte chunks); at half h and step s it gives physical k
// 32 c + 16 h + 8 s + {0..3} as the mma's k 4c..4c+3 and + {4..7} as 16+4c..16+4c+3, for the
// weights (A) and the activations (B) alike, so the sum over k is unchanged. Chunk q of a
// 128-byte row r is stored at chunk q ^ (r & 1): the 16-byte fragment loads are conflict-free.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/common/device_info.h"
#include "kernels/cuda/common/pdl_launch.cuh"
#include "kernels/cuda/common/ptx_ops.cuh"
#include "kernels/cuda/moe/moe_activation.cuh"
#include "kernels/cuda/moe/moe_ops.h"

namespace llm::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kBK = kMoeW8a8K;  // 128 k per stage: 128 bytes of a weight row or a token row

// kNB n8 blocks of tokens per tile (tile rows 8 kNB), kMT m16 weight tiles per warp.
template <int kNB, int kMT, int kStagesT, bool kBlock>
struct Cfg {
  static constexpr int kStages = kStagesT;
  static constexpr int kTok = 8 * kNB;
  static constexpr int kRows = 16 * kMT * kWarps;  // weight rows per CTA
  static constexpr int kW = kRows * kBK, kX = kTok * kBK;
  // Block scales of the slice: one per weight row, one per token.
  static constexpr int kWS = kBlock ? kRows * 4 : 0, kXS = kBlock ? kTok * 4 : 0;
  static constexpr int kStageBytes = kW + kX + kWS + kXS;
  static constexpr int kSmem = kStages * kStageBytes;
  static constexpr int kWCopies = kW / 16 / kThreads, kXCopies = kX / 16 / kThreads;
  static_assert(kWCopies * 16 * kThreads == kW && kXCopies * 16 * kThreads == kX, "copies");
  static_assert(kStageBytes % 16 == 0 && kRows <= kThreads && kTok <= kThreads, "stage layout");
};

__device__ __forceinline__ int Swizzle(int row, int chunk) {
  return row * kBK + ((chunk ^ (row & 1)) << 4);
}

// The operands of one group of tiles: the routed experts', or the dense group's (expert -1).
struct Group {
  const uint8_t* w;  // this expert's [wrows, k]
  const uint8_t* x;  // e4m3 [rows, k]
  const int32_t* gather;
  const float* w_scale;  // this expert's first scale
  MoeGemmScales sc;
  const float* x_scale;
  int x_scale_ld;
  int n_out, k;
  __nv_bfloat16* out;
  const float* bias;  // this expert's, or null
};

template <bool kSiluMul, int kNB, int kMT, int kStages, bool kBlock>
__global__ void __launch_bounds__(kThreads) MoeGemmW8a8Kernel(const MoeGemmArgs a) {
  using C = Cfg<kNB, kMT, kStages, kBlock>;
  ptx::GridDependencySync();  // launched with LaunchPdl
  const int tile = blockIdx.y;
  if (tile >= *a.num_tiles) return;
  const int expert = a.tiles[3 * tile], row0 = a.tiles[3 * tile + 1];
  const int rows = min(C::kTok, a.tiles[3 * tile + 2] - row0);
  const bool dense = expert < 0;  // the shared experts' group
  Group gr;
  gr.n_out = dense ? a.dense_n_out : a.n_out;
  gr.k = dense ? a.dense_k : a.k;
  const int n_out = gr.n_out;
  const int wrows = kSiluMul ? 2 * n_out : n_out;  // weight rows per expert, a multiple of 64
  const int bx = static_cast<int>(blockIdx.x);
  const int cta_row0 = bx * C::kRows;
  if (cta_row0 >= wrows) return;
  const size_t expert_row0 = dense ? 0 : static_cast<size_t>(expert) * wrows;
  gr.w = static_cast<const uint8_t*>(dense ? a.dense_w : a.w) + expert_row0 * gr.k;
  gr.x = static_cast<const uint8_t*>(dense ? a.dense_x : a.x);
  gr.gather = dense ? nullptr : a.sorted_token;
  gr.sc = dense ? a.dense_w_scale : a.w_scale;
  gr.w_scale = gr.sc.scale + (dense ? 0 : static_cast<size_t>(expert) * gr.sc.expert_stride);
  gr.x_scale = dense ? a.dense_x_scale : a.x_scale;
  gr.x_scale_ld = dense ? a.dense_x_scale_ld : a.x_scale_ld;
  gr.out = static_cast<__nv_bfloat16*>(dense ? a.dense_out : a.out);
  gr.bias = !dense && a.bias ? a.bias + expert_row0 : nullptr;  // [E][wrows]; shared: none

  extern __shared__ __align__(128) uint8_t smem[];
  auto stage_w = [&](int s) { return smem + s * C::kStageBytes; };
  auto stage_x = [&](int s) { return smem + s * C::kStageBytes + C::kW; };
  auto stage_ws = [&](int s) {
    return reinterpret_cast<float*>(smem + s * C::kStageBytes + C::kW + C::kX);
  };
  auto stage_xs = [&](int s) {
    return reinterpret_cast<float*>(smem + s * C::kStageBytes + C::kW + C::kX + C::kWS);
  };
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int K = gr.k, KT = K / kBK;
  // Weight row (within the expert) of CTA row r. gate_up: every m16 tile holds 8 gate rows,
  // then the 8 up rows of the same outputs, so a thread's accumulators pair gate and up.
  auto weight_row = [&](int r) -> int {
    const int rr = cta_row0 + r;
    if constexpr (!kSiluMul) {
      return rr;
    } else {
      const int j = (rr / 16) * 8 + (rr % 8);
      return (rr % 16) < 8 ? j : n_out + j;
    }
  };
  auto source_row = [&](int t) { return gr.gather ? gr.gather[row0 + t] : row0 + t; };

  // This thread's 16-byte copies per stage: weights (row idx / 8, chunk idx % 8), activations
  // (token idx / 8, chunk idx % 8); rows past the expert's and tokens past the tile's are
  // zero-filled.
  const uint8_t* w_src[C::kWCopies];
  int w_dst[C::kWCopies];
  bool w_valid[C::kWCopies];
#pragma unroll
  for (int i = 0; i < C::kWCopies; ++i) {
    const int idx = tid + kThreads * i, r = idx / 8, q = idx % 8;
    w_valid[i] = cta_row0 + r < wrows;
    w_src[i] = gr.w + (w_valid[i] ? static_cast<size_t>(weight_row(r)) * K + q * 16 : 0);
    w_dst[i] = Swizzle(r, q);
  }
  const uint8_t* x_src[C::kXCopies];
  int x_dst[C::kXCopies];
  bool x_valid[C::kXCopies];
#pragma unroll
  for (int i = 0; i < C::kXCopies; ++i) {
    const int idx = tid + kThreads * i, t = idx / 8, q = idx % 8;
    x_valid[i] = t < rows;
    x_src[i] = gr.x + (x_valid[i] ? static_cast<size_t>(source_row(t)) * K + q * 16 : 0);
    x_dst[i] = Swizzle(t, q);
  }
  // Block scales: thread tid < kRows copies weight row tid's, tid < kTok token tid's.
  [[maybe_unused]] const float* ws_src = nullptr;
  [[maybe_unused]] const float* xs_src = nullptr;
  [[maybe_unused]] bool ws_valid = false, xs_valid = false;
  if constexpr (kBlock) {
    ws_valid = tid < C::kRows && cta_row0 + tid < wrows;
    ws_src = gr.w_scale + (ws_valid ? (weight_row(tid) / 128) * gr.sc.block_ld : 0);
    xs_valid = tid < rows;
    xs_src = gr.x_scale + (xs_valid ? source_row(tid) : 0);
  }
  auto load_stage = [&](int stage, int kt) {
    const size_t k0 = static_cast<size_t>(kt) * kBK;
#pragma unroll
    for (int i = 0; i < C::kWCopies; ++i) {
      ptx::CpAsync16(stage_w(stage) + w_dst[i], w_src[i] + (w_valid[i] ? k0 : 0), w_valid[i]);
    }
#pragma unroll
    for (int i = 0; i < C::kXCopies; ++i) {
      ptx::CpAsync16(stage_x(stage) + x_dst[i], x_src[i] + (x_valid[i] ? k0 : 0), x_valid[i]);
    }
    if constexpr (kBlock) {
      if (tid < C::kRows) {
        ptx::CpAsync4(stage_ws(stage) + tid, ws_src + (ws_valid ? kt : 0), ws_valid);
      }
      if (tid < C::kTok) {
        ptx::CpAsync4(stage_xs(stage) + tid,
                      xs_src + (xs_valid ? static_cast<size_t>(kt) * gr.x_scale_ld : 0), xs_valid);
      }
    }
  };

  const int g = lane / 4, c = lane % 4;
  const int nb_used = (rows + 7) / 8;  // n8 blocks holding tokens (warp-uniform)
  const bool warp_active = cta_row0 + warp * 16 * kMT < wrows;
  // acc: the current slice's sums; total: the finished slices' (scaled by their block scales
  // with kBlock). Promoting every 128-wide slice's sum to an fp32 add keeps the tensor cores'
  // fp8 accumulation (narrower than fp32 on Hopper) to 128 products whatever k.
  float acc[kMT][kNB][4] = {};
  float total[kMT][kNB][4] = {};
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
      const uint8_t* xs = stage_x(stage);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        // Chunk 2 c + h (physical k 32 c + 16 h .. + 15) of weight rows g, g + 8 of each m16
        // tile and of token g of each n8 block (the rows of a fragment share g's parity).
        uint4 wv[kMT][2], xv[kNB];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            const int r = (warp * kMT + mt) * 16 + g + 8 * hh;
            wv[mt][hh] = *reinterpret_cast<const uint4*>(ws + Swizzle(r, 2 * c + h));
          }
        }
#pragma unroll
        for (int nb = 0; nb < kNB; ++nb) {
          if (nb < nb_used) {
            xv[nb] = *reinterpret_cast<const uint4*>(xs + Swizzle(nb * 8 + g, 2 * c + h));
          }
        }
#pragma unroll
        for (int s = 0; s < 2; ++s) {
          // Words 2 s (the mma's k 4c..4c+3) and 2 s + 1 (k 16+4c..16+4c+3) of each chunk.
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            const uint32_t* w0 = reinterpret_cast<const uint32_t*>(&wv[mt][0]);
            const uint32_t* w1 = reinterpret_cast<const uint32_t*>(&wv[mt][1]);
            // a0: row g, k 4c..; a1: row g + 8, k 4c..; a2: row g, k 16+4c..; a3: row g + 8.
            const uint32_t af[4] = {w0[2 * s], w1[2 * s], w0[2 * s + 1], w1[2 * s + 1]};
#pragma unroll
            for (int nb = 0; nb < kNB; ++nb) {
              if (nb < nb_used) {
                const uint32_t* xw = reinterpret_cast<const uint32_t*>(&xv[nb]);
                ptx::MmaE4m3(acc[mt][nb], af, xw[2 * s], xw[2 * s + 1]);
              }
            }
          }
        }
      }
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        float s_lo = 1.f, s_hi = 1.f;  // weight rows g, g + 8
        if constexpr (kBlock) {
          const int r = (warp * kMT + mt) * 16 + g;
          s_lo = stage_ws(stage)[r], s_hi = stage_ws(stage)[r + 8];
        }
#pragma unroll
        for (int nb = 0; nb < kNB; ++nb) {
          if (nb >= nb_used) continue;
          float x0 = 1.f, x1 = 1.f;  // tokens 2c, 2c + 1
          if constexpr (kBlock) {
            x0 = stage_xs(stage)[nb * 8 + 2 * c], x1 = stage_xs(stage)[nb * 8 + 2 * c + 1];
          }
          total[mt][nb][0] += acc[mt][nb][0] * (s_lo * x0);
          total[mt][nb][1] += acc[mt][nb][1] * (s_lo * x1);
          total[mt][nb][2] += acc[mt][nb][2] * (s_hi * x0);
          total[mt][nb][3] += acc[mt][nb][3] * (s_hi * x1);
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[mt][nb][i] = 0.f;
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
  // g + 8. Per-row / per-tensor scales: the weight row's times the token's, applied here.
  constexpr int kCols = kSiluMul ? C::kRows / 2 : C::kRows;  // output columns per CTA
  constexpr int kORow = kCols + 8;                           // bf16 per staged row
  static_assert(C::kTok * kORow * 2 <= C::kSmem, "output tile fits the stages");
  auto* ot = reinterpret_cast<__nv_bfloat16*>(smem);
  if (warp_active) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      const int tl = warp * kMT + mt;  // the CTA's m16 tile
      // The weight scales of rows g and g + 8 (1 where the blocks applied theirs).
      float wsc[2] = {1.f, 1.f};
      if constexpr (!kBlock) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          wsc[hh] = gr.w_scale[weight_row(tl * 16 + g + 8 * hh) * gr.sc.row_stride];
        }
      }
#pragma unroll
      for (int nb = 0; nb < kNB; ++nb) {
        if (nb >= nb_used) continue;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int t = nb * 8 + 2 * c + j;
          float v[2];  // rows g, g + 8
          if constexpr (kBlock) {
            v[0] = total[mt][nb][j], v[1] = total[mt][nb][2 + j];
          } else {
            const float xsc = t < rows ? gr.x_scale[source_row(t)] : 0.f;
            v[0] = total[mt][nb][j] * (wsc[0] * xsc), v[1] = total[mt][nb][2 + j] * (wsc[1] * xsc);
          }
          if constexpr (kSiluMul) {
            const int col = tl * 8 + g, jg = bx * kCols + col;
            float gt = v[0], up = v[1];
            if (gr.bias) gt += gr.bias[jg], up += gr.bias[n_out + jg];
            ot[t * kORow + col] =
                __float2bfloat16_rn(MoeGateUp(gt, up, a.swiglu_limit, a.swiglu_alpha));
          } else {
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
              const int col = tl * 16 + g + 8 * hh;
              ot[t * kORow + col] =
                  __float2bfloat16_rn(v[hh] + (gr.bias ? gr.bias[cta_row0 + col] : 0.f));
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
  for (int i = tid; i < rows * chunks; i += kThreads) {
    const int t = i / chunks, ch = i % chunks;
    *reinterpret_cast<uint4*>(gr.out + static_cast<size_t>(row0 + t) * n_out + bx * kCols +
                              ch * 8) = *reinterpret_cast<const uint4*>(ot + t * kORow + ch * 8);
  }
}

template <bool kSiluMul, int kNB, int kMT, int kStages, bool kBlock>
void Launch(const MoeGemmArgs& a, cudaStream_t stream) {
  using C = Cfg<kNB, kMT, kStages, kBlock>;
  const int n = a.dense_w != nullptr && a.dense_n_out > a.n_out ? a.dense_n_out : a.n_out;
  const int wrows = (kSiluMul ? 2 : 1) * n;
  const dim3 grid((wrows + C::kRows - 1) / C::kRows, a.max_tiles);
  auto* kernel = MoeGemmW8a8Kernel<kSiluMul, kNB, kMT, kStages, kBlock>;
  // Above 48 KB of dynamic shared memory a kernel must opt in, once (thread-safe static init).
  [[maybe_unused]] static const bool opted_in =
      C::kSmem <= 48 * 1024 ||
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem) ==
          cudaSuccess;
  (void)LaunchPdl(kernel, grid, dim3(kThreads), C::kSmem, stream, a);
}

template <bool kSiluMul, bool kBlock>
bool LaunchFor(const MoeGemmArgs& a, cudaStream_t s) {
  switch (a.tile_rows) {
    case 16:  // decode: 64 weight rows per CTA (enough CTAs at batch 1), 8 stages: 7 in flight
      Launch<kSiluMul, 2, 1, 8, kBlock>(a, s);
      return true;
    case 32:
      Launch<kSiluMul, 4, 2, 4, kBlock>(a, s);
      return true;
    case 64:
      Launch<kSiluMul, 8, 2, 4, kBlock>(a, s);
      return true;
    default:
      return false;
  }
}

// The binary the current device runs (`dev` is current: the caller's).
bool RunsW8a8Binary(int /*dev*/) {
  cudaFuncAttributes attr{};
  const bool ok =
      cudaFuncGetAttributes(&attr, MoeGemmW8a8Kernel<false, 2, 1, 8, false>) == cudaSuccess &&
      attr.binaryVersion >= 89;
  cudaGetLastError();  // no compatible binary: not available, not sticky
  return ok;
}

}  // namespace

bool MoeW8a8Available() {
  return CachedForCurrentDevice<RunsW8a8Binary>();
}

bool LaunchMoeGemmW8a8(const MoeGemmArgs& a, void* stream) {
  if (!MoeMxfp4TileRowsOk(a.tile_rows) || !MoeW8a8Available() ||
      !MoeW8a8ShapeOk(a.silu_mul, a.n_out, a.k) ||
      (a.dense_w != nullptr && !MoeW8a8ShapeOk(a.silu_mul, a.dense_n_out, a.dense_k))) {
    return false;
  }
  const bool block = a.w_scale.block_ld > 0;
  // Block-scaled weights take per-128-group activation scales, the others per-token ones; the
  // dense group has the same forms.
  if (block != (a.x_scale_ld > 0) || a.x_scale == nullptr || a.w_scale.scale == nullptr) {
    return false;
  }
  if (a.dense_w != nullptr &&
      (block != (a.dense_w_scale.block_ld > 0) || block != (a.dense_x_scale_ld > 0) ||
       a.dense_x_scale == nullptr || a.dense_w_scale.scale == nullptr)) {
    return false;
  }
  if (a.max_tiles == 0) return true;
  auto s = static_cast<cudaStream_t>(stream);
  if (block) return a.silu_mul ? LaunchFor<true, true>(a, s) : LaunchFor<false, true>(a, s);
  return a.silu_mul ? LaunchFor<true, false>(a, s) : LaunchFor<false, false>(a, s);
}

}  // namespace llm::cuda
