// The MoE layer's grouped expert GEMMs on MXFP4 weights as gpt-oss checkpoints store them
// (kernels/cuda/moe/moe_ops.h, LaunchMoeGemmMxfp4): e2m1 values two per byte and one e8m0 scale
// per 32 values along k, widened to bf16 in registers (exact: a 2-bit-mantissa value times a
// power of two, by integer moves into the bf16 exponent), then the tensor cores (mma.sync
// m16n8k16, bf16 in, fp32 accumulate). The tiling is the bf16 / fp8 kernel's (moe_gemm.cu): one
// CTA per (M tile of one expert, 64 weight rows), the tile list read from device memory, a
// 4-stage cp.async pipeline; a stage is one 128-wide k slice: 64 bytes of values and 4 scale
// bytes per weight row, so a weight row is read in 64-byte runs (a quarter of the bf16 bytes).
// The k order inside each 64-wide half is permuted as in the fp8 kernel, for A and B alike:
// thread column c, k16 step st take physical k 16 c + 4 st + 0..3 as the mma's k 2c, 2c+1, 2c+8,
// 2c+9, so a thread's 16 values of a row are 8 consecutive bytes under one scale.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/common/pdl_launch.cuh"
#include "kernels/cuda/common/ptx_ops.cuh"
#include "kernels/cuda/moe/moe_activation.cuh"
#include "kernels/cuda/moe/moe_ops.h"

namespace llm::cuda {
namespace {

constexpr int kThreads = 128;  // 4 warps, each 16 weight rows (two n8 blocks)
constexpr int kBM = kMoeTileRows;
constexpr int kBN = kMoeGemmN;
constexpr int kBK = kMoeMxfp4KPad;  // 128 k per stage
constexpr int kStages = 4;
constexpr int kARow = kBK * 2 + 16;  // bf16 row of the stage, padded: conflict-free 16-byte loads
constexpr int kA = kBM * kARow;
constexpr int kBRow = kBK / 2;  // e2m1 bytes of a weight row per stage
constexpr int kB = kBN * kBRow;
constexpr int kS = kBN * (kBK / 32);  // e8m0 bytes per stage
constexpr int kStageBytes = kA + kB + kS;
constexpr int kSmemBytes = kStages * kStageBytes;
static_assert(kA % 16 == 0 && kB % 16 == 0 && kStageBytes % 16 == 0, "16-byte copies");
static_assert(kBM * kBK * 2 / 16 == 2 * kThreads && kB / 16 == 2 * kThreads, "two copies each");

// Two e2m1 values (the low nibble first) of one byte as bf16x2 (the low nibble in the low half),
// times 2^(s - 127) for the group's e8m0 byte s; exp_add = (s - 1) << 7 in both halves. A nibble
// sem (s sign, e exponent, m mantissa) is 2^(e - 1) (1 + m / 2), or m / 2 for e = 0: with em =
// (e m), the bf16 bits (em << 6) + ((s - 1) << 7) hold exponent e + s - 1 and mantissa m, which is
// the scaled value for e >= 1; em = 1 (0.5) drops the mantissa bit, em = 0 is zero. Needs
// 2 <= s <= 252 (MoeMxfp4ScaleOk: the results stay normal bf16).
__device__ __forceinline__ uint32_t E2m1x2ToBf16x2(uint32_t byte, uint32_t exp_add) {
  const uint32_t p = (byte & 0xFu) | ((byte & 0xF0u) << 12);
  const uint32_t em = p & 0x00070007u;
  uint32_t b = (em << 6) + exp_add - (__vcmpeq2(em, 0x00010001u) & 0x00400040u);
  b &= ~__vcmpeq2(em, 0u);
  return b | ((p & 0x00080008u) << 12);
}

template <bool kSiluMul>
__global__ void __launch_bounds__(kThreads) MoeGemmMxfp4Kernel(const MoeGemmArgs a) {
  ptx::GridDependencySync();  // launched with LaunchPdl
  const int tile = blockIdx.y;
  if (tile >= *a.num_tiles) return;
  extern __shared__ __align__(128) uint8_t smem[];
  auto stage_a = [&](int s) { return smem + s * kStageBytes; };
  auto stage_b = [&](int s) { return smem + s * kStageBytes + kA; };
  auto stage_s = [&](int s) { return smem + s * kStageBytes + kA + kB; };
  const int expert = a.tiles[3 * tile], row0 = a.tiles[3 * tile + 1];
  const int rows = min(kBM, a.tiles[3 * tile + 2] - row0);
  const int n_out = a.n_out;
  if (static_cast<int>(blockIdx.x) * (kSiluMul ? kBN / 2 : kBN) >= n_out) return;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int K = a.k, KP = a.mx_k_pad, KT = KP / kBK;
  const int wrows_per_expert = kSiluMul ? 2 * n_out : n_out;
  const int bx = static_cast<int>(blockIdx.x);
  // Weight row of tile row r: down, n0 + r; gate_up, warp r/16's 8 gate rows then its 8 up rows.
  auto weight_row = [&](int r) -> int {
    if (!kSiluMul) return bx * kBN + r;
    const int j = bx * (kBN / 2) + (r / 16) * 8 + (r % 8);
    return (r % 16) < 8 ? j : n_out + j;
  };
  const size_t expert_row0 = static_cast<size_t>(expert) * wrows_per_expert;
  const auto* wbase = static_cast<const uint8_t*>(a.w) + expert_row0 * (KP / 2);
  const uint8_t* sbase = a.mx_scales + expert_row0 * (KP / 32);

  // This thread's copies per stage: two 16-byte A chunks, two 16-byte B chunks, and for threads
  // < 64 the 4 scale bytes of weight row tid.
  const uint8_t* a_src[2];
  int a_dst[2], a_k[2];
  bool a_valid[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int idx = tid + kThreads * i, r = idx / (kBK / 8), c = idx % (kBK / 8);
    a_valid[i] = r < rows;
    const int src_row = a_valid[i] ? (a.sorted_token ? a.sorted_token[row0 + r] : row0 + r) : 0;
    a_k[i] = c * 8;
    a_src[i] = static_cast<const uint8_t*>(a.x) + (static_cast<size_t>(src_row) * K + a_k[i]) * 2;
    a_dst[i] = r * kARow + c * 16;
  }
  const uint8_t* b_src[2];
  int b_dst[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int idx = tid + kThreads * i, r = idx / (kBRow / 16), c = idx % (kBRow / 16);
    b_src[i] = wbase + static_cast<size_t>(weight_row(r)) * (KP / 2) + c * 16;
    b_dst[i] = r * kBRow + c * 16;
  }
  const uint8_t* s_src =
      tid < kBN ? sbase + static_cast<size_t>(weight_row(tid)) * (KP / 32) : sbase;
  auto load_stage = [&](int stage, int kt) {
    const int k0 = kt * kBK;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const bool in_k = k0 + a_k[i] < K;  // k past K: zeros (the weights' padding is zero too)
      ptx::CpAsync16(stage_a(stage) + a_dst[i], a_src[i] + (in_k ? k0 * 2 : 0), a_valid[i] && in_k);
      ptx::CpAsync16(stage_b(stage) + b_dst[i], b_src[i] + kt * kBRow, true);
    }
    if (tid < kBN) ptx::CpAsync4(stage_s(stage) + tid * 4, s_src + kt * 4, true);
  };

  float acc[2][4] = {};
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < KT) load_stage(s, s);
    ptx::CpAsyncCommit();
  }
  const int g = lane / 4, c = lane % 4;
  for (int kt = 0; kt < KT; ++kt) {
    ptx::CpAsyncWait<kStages - 2>();
    __syncthreads();
    const int stage = kt % kStages;
    const uint8_t* as = stage_a(stage);
    const uint8_t* bs = stage_b(stage);
    const uint8_t* ss = stage_s(stage);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      // A rows g and g + 8, physical k [64 h + 16 c, + 16); B rows of the two n8 blocks, the same
      // k: 8 bytes of values under the scale of group 2 h + c / 2.
      uint4 a_lo[2], a_hi[2];
      const uint8_t* ap = as + g * kARow + h * 128 + c * 32;
      a_lo[0] = *reinterpret_cast<const uint4*>(ap);
      a_lo[1] = *reinterpret_cast<const uint4*>(ap + 16);
      a_hi[0] = *reinterpret_cast<const uint4*>(ap + 8 * kARow);
      a_hi[1] = *reinterpret_cast<const uint4*>(ap + 8 * kARow + 16);
      uint2 b[2];
      uint32_t exp_add[2];
#pragma unroll
      for (int nb = 0; nb < 2; ++nb) {
        const int n = warp * 16 + nb * 8 + g;
        b[nb] = *reinterpret_cast<const uint2*>(bs + n * kBRow + h * 32 + c * 8);
        const uint32_t s = ss[n * 4 + 2 * h + c / 2];
        exp_add[nb] = ((s - 1u) << 7) * 0x00010001u;
      }
      const uint32_t* lo = reinterpret_cast<const uint32_t*>(a_lo);  // 8 words: k pairs
      const uint32_t* hi = reinterpret_cast<const uint32_t*>(a_hi);
#pragma unroll
      for (int st = 0; st < 4; ++st) {
        const uint32_t af[4] = {lo[2 * st], hi[2 * st], lo[2 * st + 1], hi[2 * st + 1]};
#pragma unroll
        for (int nb = 0; nb < 2; ++nb) {
          // Values 4 st .. 4 st + 3 of the thread's 16: bytes 2 st (the mma's k 2c, 2c+1) and
          // 2 st + 1 (k 2c+8, 2c+9).
          const uint32_t word = st < 2 ? b[nb].x : b[nb].y;
          const int sh = (st % 2) * 16;
          const uint32_t w_lo = E2m1x2ToBf16x2((word >> sh) & 0xFFu, exp_add[nb]);
          const uint32_t w_hi = E2m1x2ToBf16x2((word >> (sh + 8)) & 0xFFu, exp_add[nb]);
          ptx::MmaBf16(acc[nb], af, w_lo, w_hi);
        }
      }
    }
    const int next = kt + kStages - 1;
    if (next < KT) load_stage(next % kStages, next);
    ptx::CpAsyncCommit();
  }
  ptx::CpAsyncWait<0>();

  // Accumulator (m16n8): c[0..1] row lane / 4, columns 2 (lane % 4) + {0, 1}; c[2..3] row + 8.
  auto* out = static_cast<__nv_bfloat16*>(a.out);
  const float* bias = a.bias;
  const int c2 = c * 2;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int m = g + 8 * hh;
    if (m >= rows) continue;
    const size_t orow = static_cast<size_t>(row0 + m) * n_out;
    if constexpr (kSiluMul) {
      const int col = bx * (kBN / 2) + warp * 8 + c2;
      const float* b = bias ? bias + static_cast<size_t>(expert) * 2 * n_out : nullptr;
      float v[2];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        float gt = acc[0][2 * hh + j], up = acc[1][2 * hh + j];
        if (b) gt += b[col + j], up += b[n_out + col + j];
        v[j] = MoeGateUp(gt, up, a.swiglu_limit, a.swiglu_alpha);
      }
      *reinterpret_cast<__nv_bfloat162*>(out + orow + col) = __floats2bfloat162_rn(v[0], v[1]);
    } else {
#pragma unroll
      for (int nb = 0; nb < 2; ++nb) {
        const int col = bx * kBN + warp * 16 + nb * 8 + c2;
        const float* b = bias ? bias + static_cast<size_t>(expert) * n_out + col : nullptr;
        *reinterpret_cast<__nv_bfloat162*>(out + orow + col) = __floats2bfloat162_rn(
            acc[nb][2 * hh] + (b ? b[0] : 0.f), acc[nb][2 * hh + 1] + (b ? b[1] : 0.f));
      }
    }
  }
}

template <bool kSiluMul>
void Launch(const MoeGemmArgs& a, cudaStream_t stream) {
  const dim3 grid(a.n_out / (kSiluMul ? kBN / 2 : kBN), a.max_tiles);
  auto* kernel = MoeGemmMxfp4Kernel<kSiluMul>;
  static_assert(kSmemBytes <= 48 * 1024, "no opt-in needed");
  (void)LaunchPdl(kernel, grid, dim3(kThreads), kSmemBytes, stream, a);
}

}  // namespace

void LaunchMoeGemmMxfp4(const MoeGemmArgs& a, void* stream) {
  if (a.max_tiles == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  a.silu_mul ? Launch<true>(a, s) : Launch<false>(a, s);
}

}  // namespace llm::cuda
