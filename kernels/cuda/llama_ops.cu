#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/block_abs_max.cuh"
#include "kernels/cuda/fp8_quant.h"
#include "kernels/cuda/llama_ops.h"
#include "kernels/cuda/ptx_ops.cuh"

namespace llm::cuda {
namespace {

__global__ void EmbeddingKernel(const __nv_bfloat16* table, const int32_t* ids, int hidden,
                                float* residual) {
  const int t = blockIdx.x;
  const __nv_bfloat16* row = table + static_cast<size_t>(ids[t]) * hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    residual[static_cast<size_t>(t) * hidden + i] = __bfloat162float(row[i]);
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

// One CTA per output row.
__global__ void AddRmsNormKernel(float* residual, const __nv_bfloat16* delta,
                                 const __nv_bfloat16* weight, const int32_t* rows, int hidden,
                                 float eps, __nv_bfloat16* out) {
  const int out_row = blockIdx.x;
  const int t = rows ? rows[out_row] : out_row;
  float* x = residual + static_cast<size_t>(t) * hidden;
  float ss = 0.f;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    float v = x[i];
    if (delta) {
      v += __bfloat162float(delta[static_cast<size_t>(t) * hidden + i]);
      x[i] = v;
    }
    ss += v * v;
  }
  const float inv = rsqrtf(BlockSum(ss) / hidden + eps);
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    out[static_cast<size_t>(out_row) * hidden + i] =
        __float2bfloat16_rn(x[i] * inv * __bfloat162float(weight[i]));
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
// Stores 8 values as bf16; with kAmax also folds max |stored value| into *m.
template <bool kAmax = false>
__device__ __forceinline__ void StoreBf16x8(__nv_bfloat16* p, const float (&f)[8],
                                            float* m = nullptr) {
  uint4 u;
  auto* h = reinterpret_cast<__nv_bfloat162*>(&u);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    h[j] = __floats2bfloat162_rn(f[2 * j], f[2 * j + 1]);
    if constexpr (kAmax) {
      const float2 r = __bfloat1622float2(h[j]);
      *m = fmaxf(*m, fmaxf(fabsf(r.x), fabsf(r.y)));
    }
  }
  *reinterpret_cast<uint4*>(p) = u;
}

// The fp8 activation absmax of the kernel's output, when the next projection is an fp8 GEMM.
template <bool kAmax>
__device__ __forceinline__ void FoldAmax(float m, float* amax) {
  if constexpr (kAmax) detail::BlockFoldAbsMax(m, amax);
}

// AddRmsNormKernel for hidden % 8 == 0 and hidden <= 8 * kChunks * blockDim: the row stays in
// registers between the sum and the scaling, and every access is 16 bytes (one CTA per row).
template <int kChunks, bool kAmax>
__global__ void AddRmsNormVecKernel(float* residual, const __nv_bfloat16* delta,
                                    const __nv_bfloat16* weight, const int32_t* rows, int hidden,
                                    float eps, __nv_bfloat16* out, float* amax) {
  const int out_row = blockIdx.x;
  const int t = rows ? rows[out_row] : out_row;
  float* x = residual + static_cast<size_t>(t) * hidden;
  float v[kChunks][8];
  float ss = 0.f;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int i = (c * blockDim.x + threadIdx.x) * 8;
    if (i >= hidden) break;
    const float4 a = *reinterpret_cast<const float4*>(x + i);
    const float4 b = *reinterpret_cast<const float4*>(x + i + 4);
    float r[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    if (delta) {
      float d[8];
      LoadBf16x8(delta + static_cast<size_t>(t) * hidden + i, d);
#pragma unroll
      for (int j = 0; j < 8; ++j) r[j] += d[j];
      *reinterpret_cast<float4*>(x + i) = make_float4(r[0], r[1], r[2], r[3]);
      *reinterpret_cast<float4*>(x + i + 4) = make_float4(r[4], r[5], r[6], r[7]);
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      v[c][j] = r[j];
      ss += r[j] * r[j];
    }
  }
  const float inv = rsqrtf(BlockSum(ss) / hidden + eps);
  float m = 0.f;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int i = (c * blockDim.x + threadIdx.x) * 8;
    if (i >= hidden) break;
    float w[8], o[8];
    LoadBf16x8(weight + i, w);
#pragma unroll
    for (int j = 0; j < 8; ++j) o[j] = v[c][j] * inv * w[j];
    StoreBf16x8<kAmax>(out + static_cast<size_t>(out_row) * hidden + i, o, &m);
  }
  FoldAmax<kAmax>(m, amax);
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
  const int t = blockIdx.x;
  const int D = a.head_dim, half = D / 2;
  const int heads = a.num_q_heads + 2 * a.num_kv_heads;
  const int width = heads * D;
  const auto* qkv = static_cast<const __nv_bfloat16*>(a.qkv) + static_cast<size_t>(t) * width;
  const auto* bias = static_cast<const __nv_bfloat16*>(a.bias);
  const float pos = static_cast<float>(a.positions[t]);
  const int h = blockIdx.y;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const int c1 = h * D + i, c2 = c1 + half;
    float x1 = __bfloat162float(qkv[c1]), x2 = __bfloat162float(qkv[c2]);
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
  using ptx::LoadBf16x4;
  using ptx::StoreBf16x4;
  extern __shared__ float cs[];  // [D / 2] cos, then [D / 2] sin
  const int t = blockIdx.x;
  const int D = a.head_dim, half = D / 2;
  const int heads = a.num_q_heads + 2 * a.num_kv_heads;
  const float pos = static_cast<float>(a.positions[t]);
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    sincosf(pos * a.inv_freq[i], &cs[half + i], &cs[i]);
  }
  __syncthreads();
  const auto* qkv = static_cast<const __nv_bfloat16*>(a.qkv) + static_cast<size_t>(t) * heads * D;
  const auto* bias = static_cast<const __nv_bfloat16*>(a.bias);
  const int groups = half / 4;  // 4-wide groups of pairs per head
  for (int idx = threadIdx.x; idx < heads * groups; idx += blockDim.x) {
    const int h = idx / groups, i = (idx - h * groups) * 4;
    const int c1 = h * D + i, c2 = c1 + half;
    float x1[4], x2[4];
    LoadBf16x4(qkv + c1, x1);
    LoadBf16x4(qkv + c2, x2);
    if (bias) {
      float b1[4], b2[4];
      LoadBf16x4(bias + c1, b1);
      LoadBf16x4(bias + c2, b2);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        x1[j] += b1[j];
        x2[j] += b2[j];
      }
    }
    bool rotate;
    __nv_bfloat16* dst = RopeDestination(a, t, h, &rotate);
    if (!rotate) {
      StoreBf16x4(dst + i, x1);
      StoreBf16x4(dst + i + half, x2);
      continue;
    }
    float o1[4], o2[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float c = cs[i + j], sn = cs[half + i + j];
      o1[j] = x1[j] * c - x2[j] * sn;
      o2[j] = x2[j] * c + x1[j] * sn;
    }
    StoreBf16x4(dst + i, o1);
    StoreBf16x4(dst + i + half, o2);
  }
}

__device__ __forceinline__ float SiluMul(float x, float up) {
  return x / (1.f + __expf(-x)) * up;
}

// grid (tokens, column blocks); 8 columns per thread with 16-byte accesses (inter % 8 == 0).
template <bool kAmax>
__global__ void SiluMulVecKernel(const __nv_bfloat16* gate_up, int inter, __nv_bfloat16* act,
                                 float* amax) {
  const int t = blockIdx.x;
  const int i = (blockIdx.y * blockDim.x + threadIdx.x) * 8;
  float m = 0.f;
  if (i < inter) {  // no early return: FoldAmax has a barrier
    const __nv_bfloat16* g = gate_up + static_cast<size_t>(t) * 2 * inter;
    float x[8], u[8], o[8];
    LoadBf16x8(g + i, x);
    LoadBf16x8(g + inter + i, u);
#pragma unroll
    for (int j = 0; j < 8; ++j) o[j] = SiluMul(x[j], u[j]);
    StoreBf16x8<kAmax>(act + static_cast<size_t>(t) * inter + i, o, &m);
  }
  FoldAmax<kAmax>(m, amax);
}

__global__ void SiluMulKernel(const __nv_bfloat16* gate_up, int inter, __nv_bfloat16* act) {
  const int t = blockIdx.x;
  const __nv_bfloat16* g = gate_up + static_cast<size_t>(t) * 2 * inter;
  for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < inter; i += gridDim.y * blockDim.x) {
    act[static_cast<size_t>(t) * inter + i] =
        __float2bfloat16_rn(SiluMul(__bfloat162float(g[i]), __bfloat162float(g[inter + i])));
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

bool Aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

}  // namespace

void LaunchEmbedding(const void* table, const int32_t* ids, int num_tokens, int hidden,
                     float* residual, void* stream) {
  if (num_tokens == 0) return;
  EmbeddingKernel<<<num_tokens, 256, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const __nv_bfloat16*>(table), ids, hidden, residual);
}

void LaunchAddRmsNorm(float* residual, const void* delta, const void* weight, const int32_t* rows,
                      int num_rows, int hidden, float eps, void* out, void* stream, float* amax) {
  if (num_rows == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  const auto* d = static_cast<const __nv_bfloat16*>(delta);
  const auto* w = static_cast<const __nv_bfloat16*>(weight);
  auto* o = static_cast<__nv_bfloat16*>(out);
  if (hidden % 8 == 0 && hidden <= 8 * 4 * 256 && Aligned16(residual) && Aligned16(d) &&
      Aligned16(w) && Aligned16(o)) {
    // Threads so that each holds at most 4 chunks of 8 (hidden 4096: 128 threads x 4).
    const int chunks = hidden / 8;
    const int threads = std::min(256, std::max(32, (chunks + 3) / 4 + 31) / 32 * 32);
    auto launch = [&](auto kernel) {
      kernel<<<num_rows, threads, 0, s>>>(residual, d, w, rows, hidden, eps, o, amax);
    };
    if (chunks <= 2 * threads) {
      amax ? launch(AddRmsNormVecKernel<2, true>) : launch(AddRmsNormVecKernel<2, false>);
    } else {
      amax ? launch(AddRmsNormVecKernel<4, true>) : launch(AddRmsNormVecKernel<4, false>);
    }
    return;
  }
  AddRmsNormKernel<<<num_rows, 256, 0, s>>>(residual, d, w, rows, hidden, eps, o);
  if (amax) LaunchAbsMaxBf16(out, static_cast<int64_t>(num_rows) * hidden, amax, stream);
}

bool Aligned8(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 8 == 0;
}

void LaunchBiasRope(const RopeArgs& a, void* stream) {
  if (a.num_tokens == 0) return;
  if (a.head_dim % 8 == 0 && Aligned8(a.qkv) && (a.bias == nullptr || Aligned8(a.bias)) &&
      Aligned8(a.q) && Aligned8(a.k) && Aligned8(a.v)) {
    const int heads = a.num_q_heads + 2 * a.num_kv_heads;
    const int threads = std::min(256, std::max(32, (heads * a.head_dim / 8 + 31) / 32 * 32));
    BiasRopeVecKernel<<<a.num_tokens, threads, a.head_dim * sizeof(float),
                        static_cast<cudaStream_t>(stream)>>>(a);
    return;
  }
  const dim3 grid(a.num_tokens, a.num_q_heads + 2 * a.num_kv_heads);
  BiasRopeKernel<<<grid, std::min(256, std::max(32, a.head_dim / 2)), 0,
                   static_cast<cudaStream_t>(stream)>>>(a);
}

void LaunchSiluMul(const void* gate_up, int num_tokens, int inter, void* act, void* stream,
                   float* amax) {
  if (num_tokens == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  const auto* g = static_cast<const __nv_bfloat16*>(gate_up);
  auto* o = static_cast<__nv_bfloat16*>(act);
  if (inter % 8 == 0 && Aligned16(g) && Aligned16(o)) {
    const dim3 grid(num_tokens, (inter / 8 + 127) / 128);
    if (amax) {
      SiluMulVecKernel<true><<<grid, 128, 0, s>>>(g, inter, o, amax);
    } else {
      SiluMulVecKernel<false><<<grid, 128, 0, s>>>(g, inter, o, nullptr);
    }
    return;
  }
  SiluMulKernel<<<dim3(num_tokens, (inter + 255) / 256), 256, 0, s>>>(g, inter, o);
  if (amax) LaunchAbsMaxBf16(act, static_cast<int64_t>(num_tokens) * inter, amax, stream);
}

void LaunchFillRandomBf16(void* p, int64_t n, float mean, float std, uint64_t seed, void* stream) {
  FillKernel<<<1024, 256, 0, static_cast<cudaStream_t>(stream)>>>(static_cast<__nv_bfloat16*>(p), n,
                                                                  mean, std, seed);
}

}  // namespace llm::cuda
