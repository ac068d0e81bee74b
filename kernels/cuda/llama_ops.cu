#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/llama_ops.h"

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

// One CTA per token; threads over (head, pair).
__global__ void BiasRopeKernel(const RopeArgs a) {
  const int t = blockIdx.x;
  const int D = a.head_dim, half = D / 2;
  const int heads = a.num_q_heads + 2 * a.num_kv_heads;
  const int width = heads * D;
  const auto* qkv = static_cast<const __nv_bfloat16*>(a.qkv) + static_cast<size_t>(t) * width;
  const auto* bias = static_cast<const __nv_bfloat16*>(a.bias);
  const float pos = static_cast<float>(a.positions[t]);
  for (int idx = threadIdx.x; idx < heads * half; idx += blockDim.x) {
    const int h = idx / half, i = idx % half;
    const int c1 = h * D + i, c2 = c1 + half;
    float x1 = __bfloat162float(qkv[c1]), x2 = __bfloat162float(qkv[c2]);
    if (bias) {
      x1 += __bfloat162float(bias[c1]);
      x2 += __bfloat162float(bias[c2]);
    }
    __nv_bfloat16* dst;
    if (h < a.num_q_heads) {
      dst = static_cast<__nv_bfloat16*>(a.q) + (static_cast<size_t>(t) * a.num_q_heads + h) * D;
    } else if (h < a.num_q_heads + a.num_kv_heads) {
      dst = static_cast<__nv_bfloat16*>(a.k) +
            (static_cast<size_t>(t) * a.num_kv_heads + (h - a.num_q_heads)) * D;
    } else {
      dst = static_cast<__nv_bfloat16*>(a.v) +
            (static_cast<size_t>(t) * a.num_kv_heads + (h - a.num_q_heads - a.num_kv_heads)) * D;
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

__global__ void SiluMulKernel(const __nv_bfloat16* gate_up, int inter, __nv_bfloat16* act) {
  const int t = blockIdx.x;
  const __nv_bfloat16* g = gate_up + static_cast<size_t>(t) * 2 * inter;
  for (int i = threadIdx.x; i < inter; i += blockDim.x) {
    const float x = __bfloat162float(g[i]);
    act[static_cast<size_t>(t) * inter + i] =
        __float2bfloat16_rn(x / (1.f + __expf(-x)) * __bfloat162float(g[inter + i]));
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

}  // namespace

void LaunchEmbedding(const void* table, const int32_t* ids, int num_tokens, int hidden,
                     float* residual, void* stream) {
  if (num_tokens == 0) return;
  EmbeddingKernel<<<num_tokens, 256, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const __nv_bfloat16*>(table), ids, hidden, residual);
}

void LaunchAddRmsNorm(float* residual, const void* delta, const void* weight, const int32_t* rows,
                      int num_rows, int hidden, float eps, void* out, void* stream) {
  if (num_rows == 0) return;
  AddRmsNormKernel<<<num_rows, 256, 0, static_cast<cudaStream_t>(stream)>>>(
      residual, static_cast<const __nv_bfloat16*>(delta), static_cast<const __nv_bfloat16*>(weight),
      rows, hidden, eps, static_cast<__nv_bfloat16*>(out));
}

void LaunchBiasRope(const RopeArgs& a, void* stream) {
  if (a.num_tokens == 0) return;
  BiasRopeKernel<<<a.num_tokens, 256, 0, static_cast<cudaStream_t>(stream)>>>(a);
}

void LaunchSiluMul(const void* gate_up, int num_tokens, int inter, void* act, void* stream) {
  if (num_tokens == 0) return;
  SiluMulKernel<<<num_tokens, 256, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const __nv_bfloat16*>(gate_up), inter, static_cast<__nv_bfloat16*>(act));
}

void LaunchFillRandomBf16(void* p, int64_t n, float mean, float std, uint64_t seed, void* stream) {
  FillKernel<<<1024, 256, 0, static_cast<cudaStream_t>(stream)>>>(static_cast<__nv_bfloat16*>(p), n,
                                                                  mean, std, seed);
}

}  // namespace llm::cuda
