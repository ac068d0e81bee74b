// The MoE layer's grouped expert GEMMs (kernels/cuda/moe/moe_ops.h, LaunchMoeGemm): one CTA per
// (M tile of one expert, 64 weight rows), the tile list read from device memory (empty grid slots
// exit at once), so no size crosses to the host. Decode is weight-streaming: a 16-row M tile is
// all a batch-1..128 expert needs, every CTA streams its own 64-row weight slice through a
// cp.async pipeline (4 stages, fp8 7), and the tensor cores (mma.sync m16n8k16, bf16 in, fp32
// accumulate) have little to do. fp8 e4m3 weights are widened to bf16 in registers (exact); their
// scales are applied in fp32, per expert or per weight row in the epilogue, per 128x128 block to
// each 128-wide k slice's partial sums (every warp's 8-row n blocks lie inside one scale block).
// Portable across sm_80+ (no wgmma / TMA).
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/common/pdl_launch.cuh"
#include "kernels/cuda/common/ptx_ops.cuh"
#include "kernels/cuda/moe/moe_ops.h"

namespace llm::cuda {
namespace {

constexpr int kThreads = 128;  // 4 warps, each 16 weight rows (two n8 blocks)
// cp.async pipeline stages: an fp8 stage carries half a bf16 stage's weight bytes, so fp8 keeps
// twice as many ahead (the same bytes in flight; 7 x 6.4 KB fits the 48 KB of static shared
// memory).
template <bool kFp8>
constexpr int kStagesOf = kFp8 ? 7 : 4;
constexpr int kBM = kMoeTileRows;   // 16
constexpr int kBN = kMoeGemmN;      // 64 weight rows
constexpr int kBK = kMoeGemmK;      // 64
constexpr int kRowBytes = kBK * 2;  // bf16 tile rows: 128 bytes, 16-byte chunks swizzled
// fp8 kernel: B rows of 64 bytes and A rows padded to 144 bytes, both read with 16-byte loads
// (conflict-free per quarter warp). Its k order inside a stage is permuted the same way for A and
// B (thread column c, k16 step s take physical k 16 c + 4 s + 0..3 as the mma's k 2c, 2c+1,
// 2c+8, 2c+9): the sum over k is unchanged and every load is one 16-byte access.
constexpr int kFp8Row = kBK;
constexpr int kFp8ARow = kRowBytes + 16;

template <bool kFp8>
struct Smem {
  static constexpr int kStages = kStagesOf<kFp8>;
  static constexpr int kA = kBM * (kFp8 ? kFp8ARow : kRowBytes);
  static constexpr int kB = kFp8 ? kBN * kFp8Row : kBN * kRowBytes;
  alignas(128) uint8_t a[kStages][kA];
  alignas(128) uint8_t b[kStages][kB];
};

// Two e4m3 bytes (low byte first) -> two bf16 in one register, exactly.
__device__ __forceinline__ uint32_t Fp8x2ToBf16x2(uint16_t v) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v), __NV_E4M3);
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
  const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
  return *reinterpret_cast<const uint32_t*>(&b);
}

// Swizzled offset of (row, 16-byte chunk) in a 128-byte-row tile.
__device__ __forceinline__ int Swz(int row, int chunk) {
  return row * kRowBytes + ((chunk ^ (row & 7)) << 4);
}

template <bool kFp8, bool kSiluMul, bool kBlock>
__global__ void __launch_bounds__(kThreads) MoeGemmKernel(const MoeGemmArgs a) {
  static_assert(kFp8 || !kBlock, "block scales are fp8 only");
  constexpr int kStages = kStagesOf<kFp8>;
  ptx::GridDependencySync();  // launched with LaunchPdl
  const int tile = blockIdx.y;
  if (tile >= *a.num_tiles) return;
  __shared__ Smem<kFp8> sm;
  const int expert = a.tiles[3 * tile], row0 = a.tiles[3 * tile + 1];
  const int rows = min(kBM, a.tiles[3 * tile + 2] - row0);
  const bool dense = expert < 0;  // the shared experts' group
  const int n_out = dense ? a.dense_n_out : a.n_out;
  if (static_cast<int>(blockIdx.x) * (kSiluMul ? kBN / 2 : kBN) >= n_out) return;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int K = dense ? a.dense_k : a.k, KT = K / kBK;
  const int wrows_per_expert = kSiluMul ? 2 * n_out : n_out;
  // Weight row of tile row r: down, n0 + r; gate_up, warp r/16's 8 gate rows then its 8 up rows.
  const int bx = static_cast<int>(blockIdx.x);
  auto weight_row = [&](int r) -> int {
    if (!kSiluMul) return bx * kBN + r;
    const int j = bx * (kBN / 2) + (r / 16) * 8 + (r % 8);
    return (r % 16) < 8 ? j : n_out + j;
  };
  constexpr int kWBytes = kFp8 ? 1 : 2;
  const uint8_t* wbase = dense ? static_cast<const uint8_t*>(a.dense_w)
                               : static_cast<const uint8_t*>(a.w) +
                                     static_cast<size_t>(expert) * wrows_per_expert * K * kWBytes;
  const int32_t* gather = dense ? nullptr : a.sorted_token;
  const MoeGemmScales& sc = dense ? a.dense_w_scale : a.w_scale;
  const float* scale_base =
      kFp8 ? sc.scale + (dense ? 0 : static_cast<size_t>(expert) * sc.expert_stride) : nullptr;

  // This thread's copies: A one 16-byte chunk (row tid / 8, chunk tid % 8); B bf16 four
  // (rows (tid + 128 i) / 8), fp8 two (rows (tid + 128 i) / 4).
  const int a_row = tid / 8, a_chunk = tid % 8;
  const bool a_valid = a_row < rows;
  const int a_src_row = a_valid ? (gather ? gather[row0 + a_row] : row0 + a_row) : 0;
  const auto* a_src = static_cast<const uint8_t*>(dense ? a.dense_x : a.x) +
                      static_cast<size_t>(a_src_row) * K * 2 + a_chunk * 16;
  constexpr int kBCopies = kFp8 ? 2 : 4;
  constexpr int kChunksPerRow = kFp8 ? kBK / 16 : kBK / 8;
  const uint8_t* b_src[kBCopies];
  int b_dst[kBCopies];
#pragma unroll
  for (int i = 0; i < kBCopies; ++i) {
    const int idx = tid + kThreads * i, r = idx / kChunksPerRow, c = idx % kChunksPerRow;
    b_src[i] = wbase + static_cast<size_t>(weight_row(r)) * K * kWBytes + c * 16;
    b_dst[i] = kFp8 ? r * kFp8Row + c * 16 : Swz(r, c);
  }
  auto load_stage = [&](int stage, int kt) {
    const int a_dst = kFp8 ? a_row * kFp8ARow + a_chunk * 16 : Swz(a_row, a_chunk);
    ptx::CpAsync16(&sm.a[stage][a_dst], a_src + kt * kBK * 2, a_valid);
#pragma unroll
    for (int i = 0; i < kBCopies; ++i) {
      ptx::CpAsync16(&sm.b[stage][b_dst[i]], b_src[i] + kt * kBK * kWBytes, true);
    }
  };

  float acc[2][4] = {};
  // kBlock: the scaled sums of the finished 128-wide k slices; acc holds the current slice's.
  float total[2][4] = {};
  [[maybe_unused]] const float* block_scale[2] = {};
  if constexpr (kBlock) {
#pragma unroll
    for (int nb = 0; nb < 2; ++nb) {
      block_scale[nb] = scale_base + (weight_row(warp * 16 + nb * 8) / 128) * sc.block_ld;
    }
  }
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < KT) load_stage(s, s);
    ptx::CpAsyncCommit();
  }
  for (int kt = 0; kt < KT; ++kt) {
    ptx::CpAsyncWait<kStages - 2>();
    __syncthreads();
    const int stage = kt % kStages;
    const uint8_t* as = sm.a[stage];
    const uint8_t* bs = sm.b[stage];
    if constexpr (!kFp8) {
#pragma unroll
      for (int kk = 0; kk < kBK; kk += 16) {
        uint32_t af[4], r[4];
        ptx::LdMatrixX4(af, as + Swz(lane % 16, kk / 8 + lane / 16));
        const int n = warp * 16 + (lane & 7) + ((lane >> 4) << 3);
        ptx::LdMatrixX4(r, bs + Swz(n, kk / 8 + ((lane >> 3) & 1)));
        ptx::MmaBf16(acc[0], af, r[0], r[1]);
        ptx::MmaBf16(acc[1], af, r[2], r[3]);
      }
    } else {
      // Thread (g, c): A rows g and g + 8, physical k [16 c, 16 c + 16); B rows of its two n8
      // blocks, the same k (16 e4m3 bytes).
      const int g = lane / 4, c = lane % 4;
      uint4 a_lo[2], a_hi[2], b[2];
      const uint8_t* ap = as + g * kFp8ARow + c * 32;
      a_lo[0] = *reinterpret_cast<const uint4*>(ap);
      a_lo[1] = *reinterpret_cast<const uint4*>(ap + 16);
      a_hi[0] = *reinterpret_cast<const uint4*>(ap + 8 * kFp8ARow);
      a_hi[1] = *reinterpret_cast<const uint4*>(ap + 8 * kFp8ARow + 16);
#pragma unroll
      for (int nb = 0; nb < 2; ++nb) {
        b[nb] = *reinterpret_cast<const uint4*>(bs + (warp * 16 + nb * 8 + g) * kFp8Row + c * 16);
      }
      const uint32_t* lo = reinterpret_cast<const uint32_t*>(a_lo);  // 8 words: k pairs
      const uint32_t* hi = reinterpret_cast<const uint32_t*>(a_hi);
#pragma unroll
      for (int st = 0; st < 4; ++st) {
        // Step st: physical k 16 c + 4 st + {0, 1} as the mma's (2c, 2c+1), + {2, 3} as (2c+8,
        // 2c+9).
        const uint32_t af[4] = {lo[2 * st], hi[2 * st], lo[2 * st + 1], hi[2 * st + 1]};
#pragma unroll
        for (int nb = 0; nb < 2; ++nb) {
          const uint32_t wq = reinterpret_cast<const uint32_t*>(&b[nb])[st];
          ptx::MmaBf16(acc[nb], af, Fp8x2ToBf16x2(static_cast<uint16_t>(wq & 0xffffu)),
                       Fp8x2ToBf16x2(static_cast<uint16_t>(wq >> 16)));
        }
      }
    }
    if constexpr (kBlock) {
      if (kt % 2 == 1 || kt + 1 == KT) {  // the end of a 128-wide k slice (kBK = 64)
#pragma unroll
        for (int nb = 0; nb < 2; ++nb) {
          const float s = block_scale[nb][kt / 2];
#pragma unroll
          for (int i = 0; i < 4; ++i) total[nb][i] += acc[nb][i] * s, acc[nb][i] = 0.f;
        }
      }
    }
    const int next = kt + kStages - 1;
    if (next < KT) load_stage(next % kStages, next);
    ptx::CpAsyncCommit();
  }
  ptx::CpAsyncWait<0>();
  if constexpr (kBlock) {
#pragma unroll
    for (int nb = 0; nb < 2; ++nb) {
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[nb][i] = total[nb][i];
    }
  }

  // Accumulator (m16n8): c[0..1] row lane / 4, columns 2 (lane % 4) + {0, 1}; c[2..3] row + 8.
  // The scale of weight row r (1 without fp8, or where the blocks applied theirs).
  auto row_scale = [&](int r) -> float {
    if constexpr (!kFp8 || kBlock) {
      return 1.0f;
    } else {
      return scale_base[r * sc.row_stride];
    }
  };
  auto* out = static_cast<__nv_bfloat16*>(dense ? a.dense_out : a.out);
  const float* bias = dense ? nullptr : a.bias;  // the shared experts have none
  const int g = lane / 4, c2 = (lane % 4) * 2;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int m = g + 8 * h;
    if (m >= rows) continue;
    const size_t orow = static_cast<size_t>(row0 + m) * n_out;
    if constexpr (kSiluMul) {
      const int col = blockIdx.x * (kBN / 2) + warp * 8 + c2;
      const float* b = bias ? bias + static_cast<size_t>(expert) * 2 * n_out : nullptr;
      float v[2];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        float gt = acc[0][2 * h + j] * row_scale(col + j),
              up = acc[1][2 * h + j] * row_scale(n_out + col + j);
        if (b) gt += b[col + j], up += b[n_out + col + j];
        if (a.swiglu_limit > 0.f) {
          gt = fminf(gt, a.swiglu_limit);
          up = fminf(fmaxf(up, -a.swiglu_limit), a.swiglu_limit);
          v[j] = (up + 1.0f) * (gt / (1.0f + expf(-a.swiglu_alpha * gt)));
        } else {
          v[j] = gt / (1.0f + expf(-gt)) * up;
        }
      }
      *reinterpret_cast<__nv_bfloat162*>(out + orow + col) = __floats2bfloat162_rn(v[0], v[1]);
    } else {
#pragma unroll
      for (int nb = 0; nb < 2; ++nb) {
        const int col = blockIdx.x * kBN + warp * 16 + nb * 8 + c2;
        const float* b = bias ? bias + static_cast<size_t>(expert) * n_out + col : nullptr;
        *reinterpret_cast<__nv_bfloat162*>(out + orow + col) =
            __floats2bfloat162_rn(acc[nb][2 * h] * row_scale(col) + (b ? b[0] : 0.f),
                                  acc[nb][2 * h + 1] * row_scale(col + 1) + (b ? b[1] : 0.f));
      }
    }
  }
}

template <bool kFp8, bool kSiluMul, bool kBlock = false>
void Launch(const MoeGemmArgs& a, cudaStream_t stream) {
  const int n = a.dense_w != nullptr && a.dense_n_out > a.n_out ? a.dense_n_out : a.n_out;
  const dim3 grid(n / (kSiluMul ? kBN / 2 : kBN), a.max_tiles);
  (void)LaunchPdl(MoeGemmKernel<kFp8, kSiluMul, kBlock>, grid, dim3(kThreads), 0, stream, a);
}

}  // namespace

void LaunchMoeGemm(const MoeGemmArgs& a, void* stream) {
  if (a.max_tiles == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  if (a.fp8 && a.w_scale.block_ld > 0) {
    a.silu_mul ? Launch<true, true, true>(a, s) : Launch<true, false, true>(a, s);
  } else if (a.fp8) {
    a.silu_mul ? Launch<true, true>(a, s) : Launch<true, false>(a, s);
  } else {
    a.silu_mul ? Launch<false, true>(a, s) : Launch<false, false>(a, s);
  }
}

}  // namespace llm::cuda
