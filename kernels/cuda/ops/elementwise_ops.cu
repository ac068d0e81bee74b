#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/common/pdl_launch.cuh"
#include "kernels/cuda/common/ptx_ops.cuh"
#include "kernels/cuda/ops/elementwise_ops.h"
#include "kernels/cuda/ops/fp8_rows.cuh"
#include "kernels/cuda/ops/rope_pairs.cuh"

namespace llm::cuda {
namespace {

__global__ void EmbeddingKernel(const __nv_bfloat16* table, const int32_t* ids, const int32_t* feed,
                                int hidden, float scale, int vocab_begin, int vocab_rows,
                                float* residual) {
  ptx::GridDependencySync();  // launched with LaunchPdl
  const int t = blockIdx.x;
  const int32_t id = (ids[t] >= 0 ? ids[t] : feed[-ids[t] - 1]) - vocab_begin;
  if (vocab_rows >= 0 && (id < 0 || id >= vocab_rows)) {  // another rank's row
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
      residual[static_cast<size_t>(t) * hidden + i] = 0.f;
    }
    return;
  }
  const __nv_bfloat16* row = table + static_cast<size_t>(id) * hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    residual[static_cast<size_t>(t) * hidden + i] = __bfloat162float(row[i]) * scale;
  }
}

__device__ float BlockSum(float v) {
  __shared__ float partial[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < (blockDim.x + 31) / 32 ? partial[lane] : 0.f;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
  return v;
}

// Row scale of an fp8 GEMM's raw output (1 for a bf16 one).
__device__ __forceinline__ float RowScale(const float* scale, int t) {
  return scale ? scale[t] : 1.f;
}

// One CTA per output row, any width and alignment: the sum of squares, then (fp8 output) the
// row's absmax, then the output, each pass over the residual row in global memory.
__global__ void AddRmsNormKernel(const RmsNormArgs a) {
  ptx::GridDependencySync();  // launched with LaunchPdl
  const int out_row = blockIdx.x, hidden = a.hidden;
  const int t = a.rows ? a.rows[out_row] : out_row;
  float* x = a.residual + static_cast<size_t>(t) * hidden;
  const auto* delta = static_cast<const __nv_bfloat16*>(a.delta);
  const auto* weight = static_cast<const __nv_bfloat16*>(a.weight);
  const auto* dnorm = static_cast<const __nv_bfloat16*>(a.delta_norm);
  const auto* dbias = static_cast<const __nv_bfloat16*>(a.delta_bias);
  const float ds = RowScale(a.delta_scale, t), off = a.weight_offset;
  auto delta_at = [&](int i) {  // the projection's output: row scale, then bias
    const float d = __bfloat162float(delta[static_cast<size_t>(t) * hidden + i]) * ds;
    return dbias ? d + __bfloat162float(dbias[i]) : d;
  };
  float dinv = 1.f;
  if (delta && dnorm) {
    float dss = 0.f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) dss += delta_at(i) * delta_at(i);
    dinv = rsqrtf(BlockSum(dss) / hidden + a.eps);
  }
  float ss = 0.f;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    float v = x[i];
    if (delta) {
      const float d = delta_at(i);
      v += dnorm ? d * dinv * (off + __bfloat162float(dnorm[i])) : d;
      x[i] = v;
    }
    ss += v * v;
  }
  const float inv = rsqrtf(BlockSum(ss) / hidden + a.eps);
  if (a.out_f32 != nullptr) {
    float* o = a.out_f32 + static_cast<size_t>(out_row) * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
      o[i] = x[i] * inv * __bfloat162float(weight[i]);
    }
  }
  if (a.out_fp8.q == nullptr) {
    auto* out = static_cast<__nv_bfloat16*>(a.out) + static_cast<size_t>(out_row) * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
      out[i] = __float2bfloat16_rn(x[i] * inv * (off + __bfloat162float(weight[i])));
    }
    return;
  }
  float m = 0.f;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    m = fmaxf(m, fabsf(x[i] * inv * (off + __bfloat162float(weight[i]))));
  }
  const float sc = detail::Fp8Scale(detail::BlockMax(m));
  if (threadIdx.x == 0) a.out_fp8.scale[out_row] = sc;
  auto* q = static_cast<uint8_t*>(a.out_fp8.q) + static_cast<size_t>(out_row) * hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    q[i] = detail::ToFp8(x[i] * inv * (off + __bfloat162float(weight[i])), sc);
  }
}

// 8 bf16 <-> fp32, through one 16-byte access.
__device__ __forceinline__ void LoadBf16x8(const __nv_bfloat16* p, float (&f)[8]) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const auto* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 x = __bfloat1622float2(h[j]);
    f[2 * j] = x.x;
    f[2 * j + 1] = x.y;
  }
}
__device__ __forceinline__ void StoreBf16x8(__nv_bfloat16* p, const float (&f)[8]) {
  uint4 u;
  auto* h = reinterpret_cast<__nv_bfloat162*>(&u);
#pragma unroll
  for (int j = 0; j < 4; ++j) h[j] = __floats2bfloat162_rn(f[2 * j], f[2 * j + 1]);
  *reinterpret_cast<uint4*>(p) = u;
}

// Writes a row held in registers as chunks of 8 (chunk c at column (c * blockDim + tid) * 8):
// bf16, or e4m3 with the row's scale (a block-wide absmax first). Every thread of the CTA calls it.
template <int kChunks, bool kFp8>
__device__ __forceinline__ void StoreRow(float (&v)[kChunks][8], int cols, size_t row,
                                         void* out_bf16, const Fp8Rows& out_fp8) {
  float sc = 1.f;
  if constexpr (kFp8) {
    float m = 0.f;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      if ((c * blockDim.x + threadIdx.x) * 8 >= cols) break;
#pragma unroll
      for (int j = 0; j < 8; ++j) m = fmaxf(m, fabsf(v[c][j]));
    }
    sc = detail::Fp8Scale(detail::BlockMax(m));
    if (threadIdx.x == 0) out_fp8.scale[row] = sc;
  }
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int i = (c * blockDim.x + threadIdx.x) * 8;
    if (i >= cols) break;
    if constexpr (kFp8) {
      detail::StoreFp8x8Fast(static_cast<uint8_t*>(out_fp8.q) + row * cols + i, v[c], 1.f / sc);
    } else {
      StoreBf16x8(static_cast<__nv_bfloat16*>(out_bf16) + row * cols + i, v[c]);
    }
  }
}

// AddRmsNormKernel for hidden % 8 == 0 and hidden <= 8 * kChunks * blockDim: the row stays in
// registers between the sum, the absmax and the output, and every access is 8 or 16 bytes.
// kDeltaNorm: a.delta_norm is set (a compile-time switch, so the plain norm keeps its registers).
template <int kChunks, bool kFp8, bool kDeltaNorm>
__global__ void AddRmsNormVecKernel(const RmsNormArgs a) {
  const int hidden = a.hidden;
  // The norm weights are no kernel's output: read them before waiting for the previous kernel.
  float w[kChunks][8], wd[kChunks][8];
  const auto* dnorm = kDeltaNorm ? static_cast<const __nv_bfloat16*>(a.delta_norm) : nullptr;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int i = (c * blockDim.x + threadIdx.x) * 8;
    if (i < hidden) {
      LoadBf16x8(static_cast<const __nv_bfloat16*>(a.weight) + i, w[c]);
      if (dnorm) LoadBf16x8(dnorm + i, wd[c]);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        w[c][j] += a.weight_offset;
        if (dnorm) wd[c][j] += a.weight_offset;
      }
    }
  }
  ptx::GridDependencySync();  // launched with LaunchPdl
  const int out_row = blockIdx.x;
  const int t = a.rows ? a.rows[out_row] : out_row;
  float* x = a.residual + static_cast<size_t>(t) * hidden;
  const auto* delta = static_cast<const __nv_bfloat16*>(a.delta);
  const float ds = RowScale(a.delta_scale, t);
  // Every load of the row first (predicated, not a loop exit, so they are all in flight at once).
  float v[kChunks][8] = {}, d[kChunks][8] = {};
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int i = (c * blockDim.x + threadIdx.x) * 8;
    if (i < hidden) {
      const float4 lo = *reinterpret_cast<const float4*>(x + i);
      const float4 hi = *reinterpret_cast<const float4*>(x + i + 4);
      v[c][0] = lo.x, v[c][1] = lo.y, v[c][2] = lo.z, v[c][3] = lo.w;
      v[c][4] = hi.x, v[c][5] = hi.y, v[c][6] = hi.z, v[c][7] = hi.w;
      if (delta) LoadBf16x8(delta + static_cast<size_t>(t) * hidden + i, d[c]);
    }
  }
  // The delta as its projection's output: the row scale, then the bias (zero past hidden). The
  // bias is read here, not before the dependency wait with the norm weights, to keep its
  // registers free; it is one [H] row every CTA shares, so it comes from L2.
  const auto* dbias = static_cast<const __nv_bfloat16*>(a.delta_bias);
  if (delta) {
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int i = (c * blockDim.x + threadIdx.x) * 8;
      float b[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      if (dbias && i < hidden) LoadBf16x8(dbias + i, b);
#pragma unroll
      for (int j = 0; j < 8; ++j) d[c][j] = i < hidden ? d[c][j] * ds + b[j] : 0.f;
    }
  }
  float dinv = 1.f;  // the delta's own norm first (delta_norm), over its scaled row
  if (delta && dnorm) {
    float dss = 0.f;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
#pragma unroll
      for (int j = 0; j < 8; ++j) dss += d[c][j] * d[c][j];  // zero past hidden
    }
    dinv = rsqrtf(BlockSum(dss) / hidden + a.eps);
  }
  float ss = 0.f;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int i = (c * blockDim.x + threadIdx.x) * 8;
    if (i >= hidden) break;
    if (delta) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        v[c][j] += dnorm ? d[c][j] * dinv * wd[c][j] : d[c][j];
      }
      *reinterpret_cast<float4*>(x + i) = make_float4(v[c][0], v[c][1], v[c][2], v[c][3]);
      *reinterpret_cast<float4*>(x + i + 4) = make_float4(v[c][4], v[c][5], v[c][6], v[c][7]);
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) ss += v[c][j] * v[c][j];
  }
  const float inv = rsqrtf(BlockSum(ss) / hidden + a.eps);
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int i = (c * blockDim.x + threadIdx.x) * 8;
    if (i >= hidden) break;
#pragma unroll
    for (int j = 0; j < 8; ++j) v[c][j] = v[c][j] * inv * w[c][j];
    if (a.out_f32 != nullptr) {
      float* o = a.out_f32 + static_cast<size_t>(out_row) * hidden + i;
      *reinterpret_cast<float4*>(o) = make_float4(v[c][0], v[c][1], v[c][2], v[c][3]);
      *reinterpret_cast<float4*>(o + 4) = make_float4(v[c][4], v[c][5], v[c][6], v[c][7]);
    }
  }
  StoreRow<kChunks, kFp8>(v, hidden, out_row, a.out, a.out_fp8);
}

// Row of token t's fused-projection head h in the split outputs: q heads, then k, then v; only q
// and k are rotated.
__device__ __forceinline__ __nv_bfloat16* RopeDestination(const RopeArgs& a, int t, int h,
                                                          bool* rotate) {
  const size_t D = a.head_dim;
  *rotate = h < a.num_q_heads + a.num_kv_heads;
  if (h < a.num_q_heads) {
    return static_cast<__nv_bfloat16*>(a.q) + (static_cast<size_t>(t) * a.num_q_heads + h) * D;
  }
  h -= a.num_q_heads;
  if (h < a.num_kv_heads) {
    return static_cast<__nv_bfloat16*>(a.k) + (static_cast<size_t>(t) * a.num_kv_heads + h) * D;
  }
  h -= a.num_kv_heads;
  return static_cast<__nv_bfloat16*>(a.v) + (static_cast<size_t>(t) * a.num_kv_heads + h) * D;
}

// One CTA per (token, head); threads over the head's rotary pairs.
__global__ void BiasRopeKernel(const RopeArgs a) {
  ptx::GridDependencySync();  // launched with LaunchPdl
  const int t = blockIdx.x;
  const int D = a.head_dim, half = D / 2;
  const int heads = a.num_q_heads + 2 * a.num_kv_heads;
  const int width = heads * D;
  const auto* qkv = static_cast<const __nv_bfloat16*>(a.qkv) + static_cast<size_t>(t) * width;
  const auto* bias = static_cast<const __nv_bfloat16*>(a.bias);
  const float pos = static_cast<float>(a.positions[t]);
  const int h = blockIdx.y;
  const float rs = RowScale(a.qkv_scale, t);
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const int c1 = h * D + i, c2 = c1 + half;
    float x1 = __bfloat162float(qkv[c1]) * rs, x2 = __bfloat162float(qkv[c2]) * rs;
    if (bias) {
      x1 += __bfloat162float(bias[c1]);
      x2 += __bfloat162float(bias[c2]);
    }
    bool rotate;
    __nv_bfloat16* dst = RopeDestination(a, t, h, &rotate);
    if (!rotate) {
      dst[i] = __float2bfloat16_rn(x1);
      dst[i + half] = __float2bfloat16_rn(x2);
      continue;
    }
    // Same float math as the CPU oracle: angle = pos * inv_freq (fp32), cos/sin in fp32.
    float s, c;
    sincosf(pos * a.inv_freq[i], &s, &c);
    dst[i] = __float2bfloat16_rn(x1 * c - x2 * s);
    dst[i + half] = __float2bfloat16_rn(x2 * c + x1 * s);
  }
}

// One CTA per token: the token's cos/sin (D / 2 angles) once in shared memory instead of once per
// head, then every head's (i, i + D/2) pairs four at a time with 8-byte accesses. The per-head
// kernel above spent most of its time in per-head sincosf and 2-byte accesses over a
// tokens x heads grid of 64-thread CTAs. Same float math as the CPU oracle.
__global__ void BiasRopeVecKernel(const RopeArgs a) {
  ptx::GridDependencySync();     // launched with LaunchPdl
  extern __shared__ float cs[];  // [D / 2] cos, then [D / 2] sin
  const int t = blockIdx.x;
  const int D = a.head_dim, half = D / 2;
  const int heads = a.num_q_heads + 2 * a.num_kv_heads;
  rope::FillAngles(static_cast<float>(a.positions[t]), a.inv_freq, half, cs);
  __syncthreads();
  const auto* qkv = static_cast<const __nv_bfloat16*>(a.qkv) + static_cast<size_t>(t) * heads * D;
  const auto* bias = static_cast<const __nv_bfloat16*>(a.bias);
  const int groups = half / 4;  // 4-wide groups of pairs per head
  const float rs = RowScale(a.qkv_scale, t);
  for (int idx = threadIdx.x; idx < heads * groups; idx += blockDim.x) {
    const int h = idx / groups, i = (idx - h * groups) * 4;
    float x1[4], x2[4];
    rope::LoadPairs(qkv, bias, h * D + i, half, rs, x1, x2);
    bool rotate;
    __nv_bfloat16* dst = RopeDestination(a, t, h, &rotate);
    if (rotate) rope::Rotate(cs, i, half, x1, x2);
    ptx::StoreBf16x4(dst + i, x1);
    ptx::StoreBf16x4(dst + i + half, x2);
  }
}

// BiasRope with the per-head q/k RMSNorm first: one CTA per token, one warp per head (the norm
// is a sum over the head), each lane holding groups of 4 pairs (head_dim <= 8 * 32 * kGroups).
// Values stay fp32 between the norm and the rotation; one bf16 rounding at the store.
constexpr int kQkNormGroups = kMaxQkNormHeadDim / 256;
__global__ void QkNormRopeKernel(const RopeArgs a) {
  ptx::GridDependencySync();     // launched with LaunchPdl
  extern __shared__ float cs[];  // [D / 2] cos, then [D / 2] sin
  const int t = blockIdx.x;
  const int D = a.head_dim, half = D / 2, groups = half / 4;
  const int heads = a.num_q_heads + 2 * a.num_kv_heads;
  rope::FillAngles(static_cast<float>(a.positions[t]), a.inv_freq, half, cs);
  __syncthreads();
  const auto* qkv = static_cast<const __nv_bfloat16*>(a.qkv) + static_cast<size_t>(t) * heads * D;
  const auto* bias = static_cast<const __nv_bfloat16*>(a.bias);
  const float rs = RowScale(a.qkv_scale, t);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  for (int h = warp; h < heads; h += warps) {
    float x1[kQkNormGroups][4], x2[kQkNormGroups][4];
    float ss = 0.f;
#pragma unroll
    for (int g = 0; g < kQkNormGroups; ++g) {
      const int i = (lane + 32 * g) * 4;
      if (lane + 32 * g >= groups) break;
      rope::LoadPairs(qkv, bias, h * D + i, half, rs, x1[g], x2[g]);
      ss = __fadd_rn(ss, rope::SumSquares(x1[g], x2[g]));
    }
    bool rotate;
    __nv_bfloat16* dst = RopeDestination(a, t, h, &rotate);
    const auto* w = static_cast<const __nv_bfloat16*>(h < a.num_q_heads ? a.q_norm
                                                      : rotate          ? a.k_norm
                                                                        : nullptr);
    float inv = 1.f;
    if (w) {
      // Lanes past the head's groups hold 0: for head_dim <= 256 the sum is the butterfly over
      // the head's D / 8 lanes that the C8 append's fused norm takes (the same bits).
      for (int o = 16; o > 0; o >>= 1) ss = __fadd_rn(ss, __shfl_xor_sync(0xffffffff, ss, o));
      inv = rsqrtf(ss / D + a.norm_eps);
    }
#pragma unroll
    for (int g = 0; g < kQkNormGroups; ++g) {
      const int i = (lane + 32 * g) * 4;
      if (lane + 32 * g >= groups) break;
      if (w) rope::NormPairs(w, i, half, inv, a.norm_offset, x1[g], x2[g]);
      if (rotate) rope::Rotate(cs, i, half, x1[g], x2[g]);
      ptx::StoreBf16x4(dst + i, x1[g]);
      ptx::StoreBf16x4(dst + i + half, x2[g]);
    }
  }
}

__device__ __forceinline__ float SiluMul(float x, float up) {
  return __fdividef(x, 1.f + __expf(-x)) * up;
}
// transformers' gelu_pytorch_tanh (GeGLU of Gemma).
__device__ __forceinline__ float GeluTanhMul(float x, float up) {
  return 0.5f * x * (1.f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x))) * up;
}
__device__ __forceinline__ float ActMul(bool gelu_tanh, float x, float up) {
  return gelu_tanh ? GeluTanhMul(x, up) : SiluMul(x, up);
}

// grid (tokens, column blocks); 8 columns per thread with 16-byte accesses (inter % 8 == 0).
__global__ void SiluMulVecKernel(const SiluMulArgs a) {
  ptx::GridDependencySync();  // launched with LaunchPdl
  const int t = blockIdx.x, inter = a.inter;
  const int i = (blockIdx.y * blockDim.x + threadIdx.x) * 8;
  if (i >= inter) return;
  const float gs = RowScale(a.gate_up_scale, t);
  const auto* g = static_cast<const __nv_bfloat16*>(a.gate_up) + static_cast<size_t>(t) * 2 * inter;
  float x[8], u[8], o[8];
  LoadBf16x8(g + i, x);
  LoadBf16x8(g + inter + i, u);
#pragma unroll
  for (int j = 0; j < 8; ++j) o[j] = ActMul(a.gelu_tanh, x[j] * gs, u[j] * gs);
  StoreBf16x8(static_cast<__nv_bfloat16*>(a.act) + static_cast<size_t>(t) * inter + i, o);
}

// fp8 output: one CTA per row (the row scale needs the whole row). The first pass keeps the row's
// products in shared memory (fp32 [inter]) and its absmax in a register, the second quantizes
// from shared memory, so a thread holds only one 16-byte chunk at a time and several CTAs stay
// resident per SM. (Holding the row in registers, 4 chunks per thread, cost occupancy and was
// slower; loading all 4 first was slower still.) inter % 8 == 0.
__global__ void __launch_bounds__(512, 3) SiluMulFp8RowKernel(const SiluMulArgs a) {
  ptx::GridDependencySync();        // launched with LaunchPdl
  extern __shared__ float4 row4[];  // [inter / 4]
  const int t = blockIdx.x, inter = a.inter, chunks = inter / 8;
  const float gs = RowScale(a.gate_up_scale, t);
  const auto* g = static_cast<const __nv_bfloat16*>(a.gate_up) + static_cast<size_t>(t) * 2 * inter;
  float m = 0.f;
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
    float x[8], u[8];
    LoadBf16x8(g + c * 8, x);
    LoadBf16x8(g + inter + c * 8, u);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      x[j] = ActMul(a.gelu_tanh, x[j] * gs, u[j] * gs);
      m = fmaxf(m, fabsf(x[j]));
    }
    row4[2 * c] = make_float4(x[0], x[1], x[2], x[3]);
    row4[2 * c + 1] = make_float4(x[4], x[5], x[6], x[7]);
  }
  const float sc = detail::Fp8Scale(detail::BlockMax(m));  // its barrier publishes row4 too
  if (threadIdx.x == 0) a.act_fp8.scale[t] = sc;
  const float inv = 1.f / sc;
  auto* q = static_cast<uint8_t*>(a.act_fp8.q) + static_cast<size_t>(t) * inter;
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
    const float4 lo = row4[2 * c], hi = row4[2 * c + 1];
    const float f[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    detail::StoreFp8x8Fast(q + c * 8, f, inv);
  }
}

// Any width and alignment; fp8 output takes a second pass over the row for its absmax.
__global__ void SiluMulKernel(const SiluMulArgs a) {
  ptx::GridDependencySync();  // launched with LaunchPdl
  const int t = blockIdx.x, inter = a.inter;
  const float gs = RowScale(a.gate_up_scale, t);
  const auto* g = static_cast<const __nv_bfloat16*>(a.gate_up) + static_cast<size_t>(t) * 2 * inter;
  auto value = [&](int i) {
    return ActMul(a.gelu_tanh, __bfloat162float(g[i]) * gs, __bfloat162float(g[inter + i]) * gs);
  };
  if (a.act_fp8.q == nullptr) {
    auto* act = static_cast<__nv_bfloat16*>(a.act) + static_cast<size_t>(t) * inter;
    for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < inter; i += gridDim.y * blockDim.x) {
      act[i] = __float2bfloat16_rn(value(i));
    }
    return;
  }
  float m = 0.f;
  for (int i = threadIdx.x; i < inter; i += blockDim.x) m = fmaxf(m, fabsf(value(i)));
  const float sc = detail::Fp8Scale(detail::BlockMax(m));
  if (threadIdx.x == 0) a.act_fp8.scale[t] = sc;
  auto* q = static_cast<uint8_t*>(a.act_fp8.q) + static_cast<size_t>(t) * inter;
  for (int i = threadIdx.x; i < inter; i += blockDim.x) q[i] = detail::ToFp8(value(i), sc);
}

__global__ void SoftCapKernel(float* x, int64_t n, float cap) {
  ptx::GridDependencySync();  // launched with LaunchPdl
  const float inv = 1.f / cap;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[i] = cap * tanhf(x[i] * inv);
  }
}

__global__ void FillKernel(__nv_bfloat16* p, int64_t n, float mean, float std, uint64_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint64_t x = (static_cast<uint64_t>(i) + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    const float u = static_cast<float>(x >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    p[i] = __float2bfloat16_rn(mean + std * 1.7320508f * (2.f * u - 1.f));
  }
}

// Rows up to 24,576 columns take the shared-memory kernel (96 KB: two CTAs per SM at least).
constexpr int kSiluRowSmemMax = 96 * 1024;

bool Aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}
bool Aligned8(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 8 == 0;
}

}  // namespace

void LaunchEmbedding(const void* table, const int32_t* ids, int num_tokens, int hidden,
                     float* residual, void* stream, const int32_t* feed, float scale,
                     int vocab_begin, int vocab_rows) {
  if (num_tokens == 0) return;
  (void)LaunchPdl(EmbeddingKernel, dim3(num_tokens), dim3(256), 0,
                  static_cast<cudaStream_t>(stream), static_cast<const __nv_bfloat16*>(table), ids,
                  feed, hidden, scale, vocab_begin, vocab_rows, residual);
}

void LaunchSoftCap(float* x, int64_t n, float cap, void* stream) {
  if (n == 0) return;
  const int blocks = static_cast<int>(std::min<int64_t>((n + 255) / 256, 4096));
  (void)LaunchPdl(SoftCapKernel, dim3(blocks), dim3(256), 0, static_cast<cudaStream_t>(stream), x,
                  n, cap);
}

void LaunchAddRmsNorm(const RmsNormArgs& a, void* stream) {
  if (a.num_rows == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  const bool fp8 = a.out_fp8.enabled();
  const bool out_aligned = fp8 ? Aligned8(a.out_fp8.q) : Aligned16(a.out);
  if (a.hidden % 8 == 0 && a.hidden <= 8 * 4 * 256 && Aligned16(a.residual) && Aligned16(a.delta) &&
      Aligned16(a.delta_bias) && Aligned16(a.delta_norm) && Aligned16(a.weight) && out_aligned) {
    // Threads so that each holds at most 4 chunks of 8 (hidden 4096: 128 threads x 4).
    const int chunks = a.hidden / 8;
    const int threads = std::min(256, std::max(32, (chunks + 3) / 4 + 31) / 32 * 32);
    auto launch = [&](auto kernel) {
      (void)LaunchPdl(kernel, dim3(a.num_rows), dim3(threads), 0, s, a);
    };
    const bool dn = a.delta_norm != nullptr && a.delta != nullptr;
    if (chunks <= 2 * threads) {
      if (dn) {
        fp8 ? launch(AddRmsNormVecKernel<2, true, true>)
            : launch(AddRmsNormVecKernel<2, false, true>);
      } else {
        fp8 ? launch(AddRmsNormVecKernel<2, true, false>)
            : launch(AddRmsNormVecKernel<2, false, false>);
      }
    } else if (dn) {
      fp8 ? launch(AddRmsNormVecKernel<4, true, true>)
          : launch(AddRmsNormVecKernel<4, false, true>);
    } else {
      fp8 ? launch(AddRmsNormVecKernel<4, true, false>)
          : launch(AddRmsNormVecKernel<4, false, false>);
    }
    return;
  }
  (void)LaunchPdl(AddRmsNormKernel, dim3(a.num_rows), dim3(256), 0, s, a);
}

void LaunchAddRmsNorm(float* residual, const void* delta, const void* weight, const int32_t* rows,
                      int num_rows, int hidden, float eps, void* out, void* stream) {
  RmsNormArgs a;
  a.residual = residual;
  a.delta = delta;
  a.weight = weight;
  a.rows = rows;
  a.num_rows = num_rows;
  a.hidden = hidden;
  a.eps = eps;
  a.out = out;
  LaunchAddRmsNorm(a, stream);
}

void LaunchBiasRope(const RopeArgs& a, void* stream) {
  if (a.num_tokens == 0) return;
  if (a.q_norm != nullptr) {  // the model checked head_dim % 8 == 0 and <= kMaxQkNormHeadDim
    (void)LaunchPdl(QkNormRopeKernel, dim3(a.num_tokens), dim3(256), a.head_dim * sizeof(float),
                    static_cast<cudaStream_t>(stream), a);
    return;
  }
  if (a.head_dim % 8 == 0 && Aligned8(a.qkv) && (a.bias == nullptr || Aligned8(a.bias)) &&
      Aligned8(a.q) && Aligned8(a.k) && Aligned8(a.v)) {
    const int heads = a.num_q_heads + 2 * a.num_kv_heads;
    const int threads = std::min(256, std::max(32, (heads * a.head_dim / 8 + 31) / 32 * 32));
    (void)LaunchPdl(BiasRopeVecKernel, dim3(a.num_tokens), dim3(threads),
                    a.head_dim * sizeof(float), static_cast<cudaStream_t>(stream), a);
    return;
  }
  const dim3 grid(a.num_tokens, a.num_q_heads + 2 * a.num_kv_heads);
  (void)LaunchPdl(BiasRopeKernel, grid, dim3(std::min(256, std::max(32, a.head_dim / 2))), 0,
                  static_cast<cudaStream_t>(stream), a);
}

void LaunchSiluMul(const SiluMulArgs& a, void* stream) {
  if (a.num_tokens == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  const bool vec = a.inter % 8 == 0 && Aligned16(a.gate_up);
  if (a.act_fp8.enabled()) {
    const int smem = a.inter * static_cast<int>(sizeof(float));
    if (vec && smem <= kSiluRowSmemMax && Aligned8(a.act_fp8.q)) {
      static const bool attr = [] {
        // Beyond the default 48 KB of dynamic shared memory, and the whole carveout for it so
        // three CTAs of a 14,336-wide row fit per SM.
        return cudaFuncSetAttribute(SiluMulFp8RowKernel,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    kSiluRowSmemMax) == cudaSuccess &&
               cudaFuncSetAttribute(SiluMulFp8RowKernel,
                                    cudaFuncAttributePreferredSharedMemoryCarveout,
                                    cudaSharedmemCarveoutMaxShared) == cudaSuccess;
      }();
      (void)attr;  // on failure the launch fails and the stream reports it
      const int threads = std::min(512, (a.inter / 8 + 31) / 32 * 32);
      (void)LaunchPdl(SiluMulFp8RowKernel, dim3(a.num_tokens), dim3(threads), smem, s, a);
    } else {
      (void)LaunchPdl(SiluMulKernel, dim3(a.num_tokens), dim3(512), 0, s, a);
    }
    return;
  }
  if (vec && Aligned16(a.act)) {
    (void)LaunchPdl(SiluMulVecKernel, dim3(a.num_tokens, (a.inter / 8 + 127) / 128), dim3(128), 0,
                    s, a);
    return;
  }
  (void)LaunchPdl(SiluMulKernel, dim3(a.num_tokens, (a.inter + 255) / 256), dim3(256), 0, s, a);
}

void LaunchSiluMul(const void* gate_up, int num_tokens, int inter, void* act, void* stream) {
  SiluMulArgs a;
  a.gate_up = gate_up;
  a.num_tokens = num_tokens;
  a.inter = inter;
  a.act = act;
  LaunchSiluMul(a, stream);
}

void LaunchFillRandomBf16(void* p, int64_t n, float mean, float std, uint64_t seed, void* stream) {
  FillKernel<<<1024, 256, 0, static_cast<cudaStream_t>(stream)>>>(static_cast<__nv_bfloat16*>(p), n,
                                                                  mean, std, seed);
}

}  // namespace llm::cuda
