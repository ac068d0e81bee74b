#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "kernels/cuda/ops/deepseek_ops.h"

namespace llm::cuda {
namespace {

using bf16 = __nv_bfloat16;

__device__ float BlockSum(float v) {
  __shared__ float partial[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < (blockDim.x + 31) / 32 ? partial[lane] : 0.f;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
  return v;
}

__device__ float BlockMax(float v) {
  __shared__ float partial[32];
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < (blockDim.x + 31) / 32 ? partial[lane] : -INFINITY;
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
  return v;
}

__global__ void RmsNormStridedKernel(const bf16* in, int in_stride, const bf16* w, int dim,
                                     float eps, bf16* out, int out_stride) {
  const bf16* x = in + static_cast<size_t>(blockIdx.x) * in_stride;
  bf16* y = out + static_cast<size_t>(blockIdx.x) * out_stride;
  float ss = 0.f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    const float v = __bfloat162float(x[i]);
    ss += v * v;
  }
  const float inv = rsqrtf(BlockSum(ss) / dim + eps);
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    y[i] = __float2bfloat16(__bfloat162float(x[i]) * inv * __bfloat162float(w[i]));
  }
}

// One CTA per (token, head), rope_dim / 2 threads: every thread loads its pair before any writes.
__global__ void DeepseekRopeKernel(DeepseekRopeArgs a) {
  const int t = blockIdx.x / a.num_heads, h = blockIdx.x % a.num_heads, i = threadIdx.x;
  const int half = a.rope_dim / 2;
  const bf16* x = static_cast<const bf16*>(a.in) + t * a.in_row + h * a.in_head;
  bf16* y = static_cast<bf16*>(a.out) + t * a.out_row + h * a.out_head;
  const float x0 = __bfloat162float(x[2 * i]), x1 = __bfloat162float(x[2 * i + 1]);
  __syncthreads();
  const float angle = static_cast<float>(a.positions[t]) * a.inv_freq[i];
  const float c = cosf(angle) * a.mscale, s = sinf(angle) * a.mscale;
  y[i] = __float2bfloat16(x0 * c - x1 * s);
  y[i + half] = __float2bfloat16(x1 * c + x0 * s);
}

__global__ void GatherLatentsKernel(const uint8_t* cache, bool fp8, float scale,
                                    const int32_t* pages, int block_size, int width, int first,
                                    bf16* out) {
  const int j = first + static_cast<int>(blockIdx.x);
  const size_t slot = static_cast<size_t>(pages[j / block_size]) * block_size + j % block_size;
  bf16* y = out + static_cast<size_t>(blockIdx.x) * width;
  if (fp8) {
    const __nv_fp8_e4m3* row = reinterpret_cast<const __nv_fp8_e4m3*>(cache) + slot * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
      y[i] = __float2bfloat16(static_cast<float>(row[i]) * scale);
    }
  } else {
    const bf16* row = reinterpret_cast<const bf16*>(cache) + slot * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x) y[i] = row[i];
  }
}

// One CTA per (head, query row).
__global__ void CausalSoftmaxKernel(const float* s, int q_rows, int kv_len, int first_pos,
                                    float scale, bf16* p) {
  const int row = blockIdx.x, i = row % q_rows;
  const int valid = min(kv_len, first_pos + i + 1);
  const float* x = s + static_cast<size_t>(row) * kv_len;
  bf16* y = p + static_cast<size_t>(row) * kv_len;
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < valid; j += blockDim.x) mx = fmaxf(mx, x[j] * scale);
  mx = BlockMax(mx);
  float sum = 0.f;
  for (int j = threadIdx.x; j < valid; j += blockDim.x) sum += expf(x[j] * scale - mx);
  const float inv = 1.0f / BlockSum(sum);
  for (int j = threadIdx.x; j < kv_len; j += blockDim.x) {
    y[j] = __float2bfloat16(j < valid ? expf(x[j] * scale - mx) * inv : 0.f);
  }
}

}  // namespace

void LaunchRmsNormStrided(const void* in, int in_stride, const void* weight, int rows, int dim,
                          float eps, void* out, int out_stride, void* stream) {
  if (rows == 0) return;
  RmsNormStridedKernel<<<rows, 256, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const bf16*>(in), in_stride, static_cast<const bf16*>(weight), dim, eps,
      static_cast<bf16*>(out), out_stride);
}

void LaunchDeepseekRope(const DeepseekRopeArgs& a, void* stream) {
  if (a.num_tokens == 0) return;
  DeepseekRopeKernel<<<a.num_tokens * a.num_heads, a.rope_dim / 2, 0,
                       static_cast<cudaStream_t>(stream)>>>(a);
}

void LaunchGatherLatents(const void* cache, bool fp8, float scale, const int32_t* pages,
                         int block_size, int width, int first, int count, void* out, void* stream) {
  if (count == 0) return;
  GatherLatentsKernel<<<count, 192, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const uint8_t*>(cache), fp8, scale, pages, block_size, width, first,
      static_cast<bf16*>(out));
}

void LaunchCausalSoftmax(const float* s, int heads, int q_rows, int kv_len, int first_pos,
                         float scale, void* p, void* stream) {
  if (heads * q_rows == 0) return;
  CausalSoftmaxKernel<<<heads * q_rows, 256, 0, static_cast<cudaStream_t>(stream)>>>(
      s, q_rows, kv_len, first_pos, scale, static_cast<bf16*>(p));
}

}  // namespace llm::cuda
