// The MoE layer's grouped expert GEMMs (kernels/cuda/moe_ops.h, LaunchMoeGemm): one CTA per
// (M tile of one expert, 64 weight rows), the tile list read from device memory (empty grid slots
// exit at once), so no size crosses to the host. Decode is weight-streaming: a 16-row M tile is
// all a batch-1..128 expert needs, every CTA streams its own 64-row weight slice through a
// 4-stage cp.async pipeline, and the tensor cores (mma.sync m16n8k16, bf16 in, fp32 accumulate)
// have little to do. fp8 e4m3 weights are widened to bf16 in registers (exact) and the expert's
// scale applied in the fp32 epilogue. Portable across sm_80+ (no wgmma / TMA).
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/moe_ops.h"

namespace llm::cuda {
namespace {

constexpr int kThreads = 128;  // 4 warps, each 16 weight rows (two n8 blocks)
constexpr int kStages = 4;
constexpr int kBM = kMoeTileRows;   // 16
constexpr int kBN = kMoeGemmN;      // 64 weight rows
constexpr int kBK = kMoeGemmK;      // 64
constexpr int kRowBytes = kBK * 2;  // bf16 tile rows: 128 bytes, 16-byte chunks swizzled
constexpr int kFp8Row = kBK + 16;  // fp8 tile rows padded to 80 bytes (conflict-light 2-byte reads)

template <bool kFp8>
struct Smem {
  static constexpr int kA = kBM * kRowBytes;
  static constexpr int kB = kFp8 ? kBN * kFp8Row : kBN * kRowBytes;
  alignas(128) uint8_t a[kStages][kA];
  alignas(128) uint8_t b[kStages][kB];
};

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared; src_bytes 0 fills zeros (rows past the expert's end).
__device__ __forceinline__ void CpAsync16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SmemAddr(dst)), "l"(src),
               "r"(src_bytes));
}
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void Ldmatrix4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(p)));
}

__device__ __forceinline__ void Mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

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

template <bool kFp8, bool kSiluMul>
__global__ void __launch_bounds__(kThreads) MoeGemmKernel(const MoeGemmArgs a) {
  const int tile = blockIdx.y;
  if (tile >= *a.num_tiles) return;
  __shared__ Smem<kFp8> sm;
  const int expert = a.tiles[3 * tile], row0 = a.tiles[3 * tile + 1];
  const int rows = min(kBM, a.tiles[3 * tile + 2] - row0);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int K = a.k, KT = K / kBK;
  const int wrows_per_expert = kSiluMul ? 2 * a.n_out : a.n_out;
  // Weight row of tile row r: down, n0 + r; gate_up, warp r/16's 8 gate rows then its 8 up rows.
  const int bx = static_cast<int>(blockIdx.x);
  auto weight_row = [&](int r) -> int {
    if (!kSiluMul) return bx * kBN + r;
    const int j = bx * (kBN / 2) + (r / 16) * 8 + (r % 8);
    return (r % 16) < 8 ? j : a.n_out + j;
  };
  constexpr int kWBytes = kFp8 ? 1 : 2;
  const uint8_t* wbase = static_cast<const uint8_t*>(a.w) +
                         static_cast<size_t>(expert) * wrows_per_expert * K * kWBytes;

  // This thread's copies: A one 16-byte chunk (row tid / 8, chunk tid % 8); B bf16 four
  // (rows (tid + 128 i) / 8), fp8 two (rows (tid + 128 i) / 4).
  const int a_row = tid / 8, a_chunk = tid % 8;
  const bool a_valid = a_row < rows;
  const int a_src_row =
      a_valid ? (a.sorted_token ? a.sorted_token[row0 + a_row] : row0 + a_row) : 0;
  const auto* a_src =
      static_cast<const uint8_t*>(a.x) + static_cast<size_t>(a_src_row) * K * 2 + a_chunk * 16;
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
    CpAsync16(&sm.a[stage][Swz(a_row, a_chunk)], a_src + kt * kBK * 2, a_valid ? 16 : 0);
#pragma unroll
    for (int i = 0; i < kBCopies; ++i) {
      CpAsync16(&sm.b[stage][b_dst[i]], b_src[i] + kt * kBK * kWBytes, 16);
    }
  };

  float acc[2][4] = {};
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < KT) load_stage(s, s);
    CpAsyncCommit();
  }
  for (int kt = 0; kt < KT; ++kt) {
    CpAsyncWait<kStages - 2>();
    __syncthreads();
    const int stage = kt % kStages;
    const uint8_t* as = sm.a[stage];
    const uint8_t* bs = sm.b[stage];
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      uint32_t af[4];
      Ldmatrix4(af, as + Swz(lane % 16, kk / 8 + lane / 16));
      uint32_t bf[2][2];
      if constexpr (!kFp8) {
        uint32_t r[4];
        const int n = warp * 16 + (lane & 7) + ((lane >> 4) << 3);
        Ldmatrix4(r, bs + Swz(n, kk / 8 + ((lane >> 3) & 1)));
        bf[0][0] = r[0], bf[0][1] = r[1], bf[1][0] = r[2], bf[1][1] = r[3];
      } else {
#pragma unroll
        for (int nb = 0; nb < 2; ++nb) {
          const uint8_t* p = bs + (warp * 16 + nb * 8 + lane / 4) * kFp8Row + kk + (lane % 4) * 2;
          bf[nb][0] = Fp8x2ToBf16x2(*reinterpret_cast<const uint16_t*>(p));
          bf[nb][1] = Fp8x2ToBf16x2(*reinterpret_cast<const uint16_t*>(p + 8));
        }
      }
      Mma(acc[0], af, bf[0][0], bf[0][1]);
      Mma(acc[1], af, bf[1][0], bf[1][1]);
    }
    const int next = kt + kStages - 1;
    if (next < KT) load_stage(next % kStages, next);
    CpAsyncCommit();
  }
  CpAsyncWait<0>();

  // Accumulator (m16n8): c[0..1] row lane / 4, columns 2 (lane % 4) + {0, 1}; c[2..3] row + 8.
  const float scale = kFp8 ? a.w_scale[expert * a.scale_stride] : 1.0f;
  auto* out = static_cast<__nv_bfloat16*>(a.out);
  const int g = lane / 4, c2 = (lane % 4) * 2;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int m = g + 8 * h;
    if (m >= rows) continue;
    const size_t orow = static_cast<size_t>(row0 + m) * a.n_out;
    if constexpr (kSiluMul) {
      const int col = blockIdx.x * (kBN / 2) + warp * 8 + c2;
      float v[2];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const float gt = acc[0][2 * h + j] * scale, up = acc[1][2 * h + j] * scale;
        v[j] = gt / (1.0f + expf(-gt)) * up;
      }
      *reinterpret_cast<__nv_bfloat162*>(out + orow + col) = __floats2bfloat162_rn(v[0], v[1]);
    } else {
#pragma unroll
      for (int nb = 0; nb < 2; ++nb) {
        const int col = blockIdx.x * kBN + warp * 16 + nb * 8 + c2;
        *reinterpret_cast<__nv_bfloat162*>(out + orow + col) =
            __floats2bfloat162_rn(acc[nb][2 * h] * scale, acc[nb][2 * h + 1] * scale);
      }
    }
  }
}

template <bool kFp8, bool kSiluMul>
void Launch(const MoeGemmArgs& a, cudaStream_t stream) {
  const dim3 grid(a.n_out / (kSiluMul ? kBN / 2 : kBN), a.max_tiles);
  MoeGemmKernel<kFp8, kSiluMul><<<grid, kThreads, 0, stream>>>(a);
}

}  // namespace

void LaunchMoeGemm(const MoeGemmArgs& a, void* stream) {
  if (a.max_tiles == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  if (a.fp8) {
    a.silu_mul ? Launch<true, true>(a, s) : Launch<true, false>(a, s);
  } else {
    a.silu_mul ? Launch<false, true>(a, s) : Launch<false, false>(a, s);
  }
}

}  // namespace llm::cuda
