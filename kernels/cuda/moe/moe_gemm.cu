// The MoE layer's grouped expert GEMMs (kernels/cuda/moe/moe_ops.h, LaunchMoeGemm): one CTA per
// (M tile of one expert, 64 weight rows), the tile list read from device memory (empty grid slots
// exit at once), so no size crosses to the host. Decode is weight-streaming: a 16-row M tile is
// all a batch-1..128 expert needs, every CTA streams its own 64-row weight slice through a
// 4-stage cp.async pipeline in 128-byte runs per row, and the tensor cores (mma.sync m16n8k16,
// bf16 in, fp32 accumulate) have little to do. fp8 e4m3 weights are widened to bf16 in registers
// (exact, by bit moves: ptx_ops.cuh); their scales are applied in fp32, per expert or per weight
// row in the epilogue, per 128x128 block to each stage's partial sums (an fp8 stage is one
// 128-wide k slice, and every warp's 8-row n blocks lie inside one scale block).
// Portable across sm_80+ (no wgmma / TMA).
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/common/pdl_launch.cuh"
#include "kernels/cuda/common/ptx_ops.cuh"
#include "kernels/cuda/moe/moe_activation.cuh"
#include "kernels/cuda/moe/moe_combine.cuh"
#include "kernels/cuda/moe/moe_ops.h"

namespace llm::cuda {
namespace {

constexpr int kThreads = 128;      // 4 warps, each 16 weight rows (two n8 blocks)
constexpr int kBM = kMoeTileRows;  // 16
constexpr int kBN = kMoeGemmN;     // 64 weight rows

// One pipeline stage: a 16-row A slice (bf16 activations) and a 64-row B slice (weights), kBK
// wide in k. Every B row slice is 128 bytes in both forms (bf16 kBK 64, e4m3 kBK 128): each
// weight row is read in 128-byte runs, and an fp8 stage moves as many weight bytes per barrier as
// a bf16 one (64-byte runs moved half the bytes per barrier and left the fp8 kernel short of the
// bf16 one's share of the copy rate: docs/BENCHMARKS.md). bf16: both operands in 128-byte rows with
// 16-byte chunks XOR-swizzled for ldmatrix. fp8: A rows padded to 272 bytes, B chunks swizzled by
// the row's parity, so the 16-byte fragment loads below are conflict-free per quarter warp. The fp8
// k order inside a 64-wide half is permuted the same way for A and B (thread column c, k16 step s
// take physical k 16 c + 4 s + 0..3 as the mma's k 2c, 2c+1, 2c+8, 2c+9): the sum over k is
// unchanged and every load is one 16-byte access.
template <bool kFp8>
struct Tile {
  static constexpr int kBK = kFp8 ? 2 * kMoeGemmK : kMoeGemmK;
  static constexpr int kStages = 4;
  static constexpr int kBRow = 128;
  static constexpr int kARow = kFp8 ? kBK * 2 + 16 : kBK * 2;
  static constexpr int kA = kBM * kARow;
  static constexpr int kB = kBN * kBRow;
  static constexpr int kStageBytes = kA + kB;  // both multiples of 128
  static constexpr int kSmemBytes = kStages * kStageBytes;
  static constexpr int kACopies = kBM * kBK * 2 / 16 / kThreads;  // 16-byte copies per thread
  static constexpr int kBCopies = kB / 16 / kThreads;
  static constexpr int kAChunks = kBK * 2 / 16;  // per A row
  static_assert(kA % 128 == 0 && kACopies * kThreads * 16 == kBM * kBK * 2, "A tile");
  // Offset of 16-byte chunk `chunk` of row `row` in a B (or bf16 A) stage.
  __device__ static int BOffset(int row, int chunk) {
    return row * kBRow + ((kFp8 ? chunk ^ ((row & 1) << 2) : chunk ^ (row & 7)) << 4);
  }
  __device__ static int AOffset(int row, int chunk) {
    return kFp8 ? row * kARow + chunk * 16 : BOffset(row, chunk);
  }
};

template <bool kFp8, bool kSiluMul, bool kBlock>
__global__ void __launch_bounds__(kThreads) MoeGemmKernel(const MoeGemmArgs a) {
  static_assert(kFp8 || !kBlock, "block scales are fp8 only");
  using T = Tile<kFp8>;
  constexpr int kBK = T::kBK, kStages = T::kStages;
  ptx::GridDependencySync();  // launched with LaunchPdl
  const int tile = blockIdx.y;
  if (tile >= *a.num_tiles) return;
  extern __shared__ __align__(128) uint8_t smem[];
  auto stage_a = [&](int s) { return smem + s * T::kStageBytes; };
  auto stage_b = [&](int s) { return smem + s * T::kStageBytes + T::kA; };
  const int expert = a.tiles[3 * tile], row0 = a.tiles[3 * tile + 1];
  const int rows = min(kBM, a.tiles[3 * tile + 2] - row0);
  const bool dense = expert < 0;  // the shared experts' group
  const int n_out = dense ? a.dense_n_out : a.n_out;
  if (static_cast<int>(blockIdx.x) * (kSiluMul ? kBN / 2 : kBN) >= n_out) return;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  // K is a multiple of 64; an fp8 tail half-stage is zero-filled (both operands).
  const int K = dense ? a.dense_k : a.k, KT = (K + kBK - 1) / kBK;
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

  // This thread's 16-byte copies: A kACopies (row idx / kAChunks), B four (row idx / 8), each at
  // element k offset k_off within the stage.
  const uint8_t* a_src[T::kACopies];
  int a_dst[T::kACopies], a_k[T::kACopies];
  bool a_valid[T::kACopies];
#pragma unroll
  for (int i = 0; i < T::kACopies; ++i) {
    const int idx = tid + kThreads * i, r = idx / T::kAChunks, c = idx % T::kAChunks;
    a_valid[i] = r < rows;
    const int src_row = a_valid[i] ? (gather ? gather[row0 + r] : row0 + r) : 0;
    a_k[i] = c * 8;
    a_src[i] = static_cast<const uint8_t*>(dense ? a.dense_x : a.x) +
               (static_cast<size_t>(src_row) * K + a_k[i]) * 2;
    a_dst[i] = T::AOffset(r, c);
  }
  const uint8_t* b_src[T::kBCopies];
  int b_dst[T::kBCopies], b_k[T::kBCopies];
#pragma unroll
  for (int i = 0; i < T::kBCopies; ++i) {
    const int idx = tid + kThreads * i, r = idx / 8, c = idx % 8;
    b_k[i] = c * 16 / kWBytes;
    b_src[i] = wbase + (static_cast<size_t>(weight_row(r)) * K + b_k[i]) * kWBytes;
    b_dst[i] = T::BOffset(r, c);
  }
  auto load_stage = [&](int stage, int kt) {
    const int k0 = kt * kBK;
#pragma unroll
    for (int i = 0; i < T::kACopies; ++i) {
      const bool in_k = !kFp8 || k0 + a_k[i] < K;
      ptx::CpAsync16(stage_a(stage) + a_dst[i], a_src[i] + (in_k ? k0 * 2 : 0), a_valid[i] && in_k);
    }
#pragma unroll
    for (int i = 0; i < T::kBCopies; ++i) {
      const bool in_k = !kFp8 || k0 + b_k[i] < K;
      ptx::CpAsync16(stage_b(stage) + b_dst[i], b_src[i] + (in_k ? k0 * kWBytes : 0), in_k);
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
    const uint8_t* as = stage_a(stage);
    const uint8_t* bs = stage_b(stage);
    if constexpr (!kFp8) {
#pragma unroll
      for (int kk = 0; kk < kBK; kk += 16) {
        uint32_t af[4], r[4];
        ptx::LdMatrixX4(af, as + T::AOffset(lane % 16, kk / 8 + lane / 16));
        const int n = warp * 16 + (lane & 7) + ((lane >> 4) << 3);
        ptx::LdMatrixX4(r, bs + T::BOffset(n, kk / 8 + ((lane >> 3) & 1)));
        ptx::MmaBf16(acc[0], af, r[0], r[1]);
        ptx::MmaBf16(acc[1], af, r[2], r[3]);
      }
    } else {
      // Thread (g, c), half h: A rows g and g + 8, physical k [64 h + 16 c, + 16); B rows of its
      // two n8 blocks, the same k (16 e4m3 bytes, chunk 4 h + c).
      const int g = lane / 4, c = lane % 4;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint4 a_lo[2], a_hi[2], b[2];
        const uint8_t* ap = as + g * T::kARow + h * 128 + c * 32;
        a_lo[0] = *reinterpret_cast<const uint4*>(ap);
        a_lo[1] = *reinterpret_cast<const uint4*>(ap + 16);
        a_hi[0] = *reinterpret_cast<const uint4*>(ap + 8 * T::kARow);
        a_hi[1] = *reinterpret_cast<const uint4*>(ap + 8 * T::kARow + 16);
#pragma unroll
        for (int nb = 0; nb < 2; ++nb) {
          b[nb] =
              *reinterpret_cast<const uint4*>(bs + T::BOffset(warp * 16 + nb * 8 + g, 4 * h + c));
        }
        const uint32_t* lo = reinterpret_cast<const uint32_t*>(a_lo);  // 8 words: k pairs
        const uint32_t* hi = reinterpret_cast<const uint32_t*>(a_hi);
#pragma unroll
        for (int st = 0; st < 4; ++st) {
          // Step st: physical k 16 c + 4 st + {0, 1} as the mma's (2c, 2c+1), + {2, 3} as
          // (2c+8, 2c+9).
          const uint32_t af[4] = {lo[2 * st], hi[2 * st], lo[2 * st + 1], hi[2 * st + 1]};
#pragma unroll
          for (int nb = 0; nb < 2; ++nb) {
            uint32_t w_lo, w_hi;
            ptx::E4m3x4ToBf16x4(reinterpret_cast<const uint32_t*>(&b[nb])[st], &w_lo, &w_hi);
            ptx::MmaBf16(acc[nb], af, w_lo, w_hi);
          }
        }
      }
    }
    if constexpr (kBlock) {  // every stage is one 128-wide k slice (kBK = 128)
#pragma unroll
      for (int nb = 0; nb < 2; ++nb) {
        const float s = block_scale[nb][kt];
#pragma unroll
        for (int i = 0; i < 4; ++i) total[nb][i] += acc[nb][i] * s, acc[nb][i] = 0.f;
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
        v[j] = MoeGateUp(gt, up, a.swiglu_limit, a.swiglu_alpha);
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
  if constexpr (!kSiluMul) {
    if (a.combine.out != nullptr) {  // the down GEMM of a small batch finishes the combine
      moe_combine::CombineAfterTile(a.combine, static_cast<const __nv_bfloat16*>(a.out), a.n_out,
                                    bx, bx * kBN, kBN, *a.num_tiles);
    }
  }
}

template <bool kFp8, bool kSiluMul, bool kBlock = false>
void Launch(const MoeGemmArgs& a, cudaStream_t stream) {
  const int n = a.dense_w != nullptr && a.dense_n_out > a.n_out ? a.dense_n_out : a.n_out;
  const dim3 grid(n / (kSiluMul ? kBN / 2 : kBN), a.max_tiles);
  constexpr int kSmem = Tile<kFp8>::kSmemBytes;
  auto* kernel = MoeGemmKernel<kFp8, kSiluMul, kBlock>;
  // Above 48 KB of dynamic shared memory a kernel must opt in, once (thread-safe static init).
  [[maybe_unused]] static const bool opted_in =
      kSmem <= 48 * 1024 ||
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem) ==
          cudaSuccess;
  (void)LaunchPdl(kernel, grid, dim3(kThreads), kSmem, stream, a);
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
