#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "kernels/cuda/common/gemv_loads.cuh"
#include "kernels/cuda/common/pdl_launch.cuh"
#include "kernels/cuda/common/ptx_ops.cuh"
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

// y = bf16(rmsnorm(x) * w) over one row of dim, by the whole CTA (its size sets the sum order).
__device__ __forceinline__ void RmsNormRow(const bf16* x, const bf16* w, int dim, float eps,
                                           bf16* y) {
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

__global__ void RmsNormStridedKernel(const bf16* in, int in_stride, const bf16* w, int dim,
                                     float eps, bf16* out, int out_stride) {
  RmsNormRow(in + static_cast<size_t>(blockIdx.x) * in_stride, w, dim, eps,
             out + static_cast<size_t>(blockIdx.x) * out_stride);
}

// Pair i of one (token t, head h) row of LaunchDeepseekRope: loaded first, stored after the
// caller's barrier where in and out alias (DeepseekRopeKernel) or at once (MlaRopeNormKernel).
struct RopePair {
  float x0, x1;
};
__device__ __forceinline__ RopePair LoadRopePair(const bf16* x, int i) {
  return {__bfloat162float(x[2 * i]), __bfloat162float(x[2 * i + 1])};
}
__device__ __forceinline__ void StoreRopePair(const DeepseekRopeArgs& a, int t, int i, RopePair p,
                                              bf16* y) {
  const int half = a.rope_dim / 2;
  const float angle = static_cast<float>(a.positions[t]) * a.inv_freq[i];
  const float c = cosf(angle) * a.mscale, s = sinf(angle) * a.mscale;
  y[i] = __float2bfloat16(p.x0 * c - p.x1 * s);
  y[i + half] = __float2bfloat16(p.x1 * c + p.x0 * s);
}

// One CTA per (token, head), rope_dim / 2 threads: every thread loads its pair before any writes.
__global__ void DeepseekRopeKernel(DeepseekRopeArgs a) {
  const int t = blockIdx.x / a.num_heads, h = blockIdx.x % a.num_heads, i = threadIdx.x;
  const bf16* x = static_cast<const bf16*>(a.in) + t * a.in_row + h * a.in_head;
  bf16* y = static_cast<bf16*>(a.out) + t * a.out_row + h * a.out_head;
  const RopePair p = LoadRopePair(x, i);
  __syncthreads();
  StoreRopePair(a, t, i, p, y);
}

// One CTA of kRopeNormThreads per token: the c_kv norm (RmsNormStridedKernel's row on a CTA of
// its size, so its bits), then every rope pair of k_pe and of the heads' q_pe. Launched with PDL:
// the rows are the projection's output, read after the wait.
constexpr int kRopeNormThreads = 256;  // RmsNormStrided's CTA: the same sum order
__global__ void __launch_bounds__(kRopeNormThreads) MlaRopeNormKernel(const MlaRopeNormArgs a) {
  ptx::GridDependencySync();
  const int t = blockIdx.x, C = a.kv_rank, half = a.rope.rope_dim / 2;
  const bf16* x = static_cast<const bf16*>(a.kv) + t * a.kv_row;
  bf16* y = static_cast<bf16*>(a.latent) + t * a.latent_row;
  RmsNormRow(x, static_cast<const bf16*>(a.kv_norm), C, a.eps, y);
  // Pair j: k_pe's for j < half, then head (j - half) / half's q_pe. Out of place: no barrier.
  const int pairs = (1 + a.rope.num_heads) * half;
  const auto* q = static_cast<const bf16*>(a.q) + t * a.q_row + a.q_nope;
  auto* q_pe = static_cast<bf16*>(a.q_pe) + static_cast<int64_t>(t) * a.rope.num_heads * 2 * half;
  for (int j = threadIdx.x; j < pairs; j += blockDim.x) {
    const int h = j / half - 1, i = j % half;
    if (h < 0) {
      StoreRopePair(a.rope, t, i, LoadRopePair(x + C, i), y + C);
    } else {
      StoreRopePair(a.rope, t, i, LoadRopePair(q + h * a.q_head, i), q_pe + h * 2 * half);
    }
  }
}

// 8 bf16 of a 16-byte load as floats.
__device__ __forceinline__ void Bf16x8(const uint4& u, float (&f)[8]) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 x = ptx::Bf16x2ToFloat2(w[i]);
    f[2 * i] = x.x, f[2 * i + 1] = x.y;
  }
}

// LaunchMlaAbsorbQ: CTA (head h, 256 columns of C); warp w takes W_UK_h's rows [w N / 8, + N / 8)
// (each lane 8 columns: 16-byte loads, the first 8 rows issued before the wait, the next 8 in
// flight while these are summed), every decode row at once; the 8 warps' partial sums meet in
// shared memory in warp order.
constexpr int kAbsorbWarps = 8;
constexpr int kAbsorbCols = 256;
template <int kR>
__global__ void __launch_bounds__(32 * kAbsorbWarps) MlaAbsorbQKernel(const MlaAbsorbArgs a) {
  __shared__ float red[kAbsorbWarps][kR][kAbsorbCols];
  const int h = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int N = a.nope, C = a.rank, NV = a.nope + a.v_dim, per = N / kAbsorbWarps;
  const int col = blockIdx.y * kAbsorbCols + 8 * lane;
  const bf16* w = static_cast<const bf16*>(a.w_kv_b) +
                  (static_cast<size_t>(h) * NV + static_cast<size_t>(warp) * per) * C + col;
  uint4 wv[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) wv[i] = ptx::LoadStream16(w + static_cast<size_t>(i) * C);
  ptx::GridDependencySync();  // q comes from the kernels before
  const bf16* q = static_cast<const bf16*>(a.q) + h * a.q_head + warp * per;
  float acc[kR][8] = {};
  for (int i0 = 0; i0 < per; i0 += 8) {
    uint4 next[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      next[i] = i0 + 8 < per ? ptx::LoadStream16(w + static_cast<size_t>(i0 + 8 + i) * C)
                             : make_uint4(0, 0, 0, 0);
    }
    float qv[kR][8];  // q[r, h, i0 .. i0 + 7] of each decode row
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      if (r < a.rows) Bf16x8(__ldg(reinterpret_cast<const uint4*>(q + r * a.q_row + i0)), qv[r]);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      float wf[8];  // widened once for every row
      Bf16x8(wv[i], wf);
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        if (r >= a.rows) break;
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[r][j] = fmaf(wf[j], qv[r][i], acc[r][j]);
      }
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) wv[i] = next[i];
  }
#pragma unroll
  for (int r = 0; r < kR; ++r) {
#pragma unroll
    for (int j = 0; j < 8; ++j) red[warp][r][8 * lane + j] = acc[r][j];
  }
  __syncthreads();
  auto* out = static_cast<bf16*>(a.q_latent);
  for (int o = threadIdx.x; o < a.rows * kAbsorbCols; o += blockDim.x) {
    const int r = o / kAbsorbCols, c = o % kAbsorbCols;
    float sum = 0.f;
#pragma unroll
    for (int w8 = 0; w8 < kAbsorbWarps; ++w8) sum += red[w8][r][c];
    out[(static_cast<size_t>(r) * a.heads + h) * C + blockIdx.y * kAbsorbCols + c] =
        __float2bfloat16(sum);
  }
}

// LaunchMlaAbsorbOut: a warp per (head, output row v): the row's C weights (16-byte loads, before
// the wait) against each decode row's out_latent, summed by shuffles.
template <int kR>
__global__ void __launch_bounds__(32 * kAbsorbWarps) MlaAbsorbOutKernel(const MlaAbsorbArgs a) {
  constexpr int kMaxChunks = 1024 / 8 / 32;  // MlaAbsorbOk: C <= 1024
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int V = a.v_dim, C = a.rank, NV = a.nope + a.v_dim, chunks = C / 256;
  const int row = blockIdx.x * kAbsorbWarps + warp, h = row / V, v = row % V;
  const bf16* w = static_cast<const bf16*>(a.w_kv_b) +
                  (static_cast<size_t>(h) * NV + a.nope + v) * C + 8 * lane;
  uint4 wv[kMaxChunks];
#pragma unroll
  for (int u = 0; u < kMaxChunks; ++u) {
    wv[u] = u < chunks ? ptx::LoadStream16(w + 256 * u) : make_uint4(0, 0, 0, 0);
  }
  ptx::GridDependencySync();  // out_latent comes from the attention
  float acc[kR] = {};
#pragma unroll
  for (int u = 0; u < kMaxChunks; ++u) {
    if (u >= chunks) break;
    float wf[8];
    Bf16x8(wv[u], wf);
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      if (r >= a.rows) break;
      const bf16* x = static_cast<const bf16*>(a.out_latent) +
                      (static_cast<size_t>(r) * a.heads + h) * C + 256 * u + 8 * lane;
      float xf[8];
      Bf16x8(__ldg(reinterpret_cast<const uint4*>(x)), xf);
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[r] = fmaf(wf[j], xf[j], acc[r]);
    }
  }
  auto* out = static_cast<bf16*>(a.attn);
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    if (r >= a.rows) break;
    float s = acc[r];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) out[(static_cast<size_t>(r) * a.heads + h) * V + v] = __float2bfloat16(s);
  }
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

void LaunchMlaRopeNorm(const MlaRopeNormArgs& a, void* stream) {
  if (a.rope.num_tokens == 0) return;
  (void)LaunchPdl(MlaRopeNormKernel, dim3(a.rope.num_tokens), dim3(kRopeNormThreads), 0,
                  static_cast<cudaStream_t>(stream), a);
}

namespace {
// The instance of a kernel template for a.rows (1, 2, else kMlaAbsorbMaxRows rows a pass).
using AbsorbKernel = void (*)(MlaAbsorbArgs);
void LaunchAbsorb(const MlaAbsorbArgs& a, const AbsorbKernel (&by_rows)[3], dim3 grid,
                  void* stream) {
  (void)LaunchPdl(by_rows[a.rows <= 2 ? a.rows - 1 : 2], grid, dim3(32 * kAbsorbWarps), 0,
                  static_cast<cudaStream_t>(stream), a);
}
}  // namespace

bool LaunchMlaAbsorbQ(const MlaAbsorbArgs& a, void* stream) {
  if (!MlaAbsorbOk(a)) return false;
  static constexpr AbsorbKernel kByRows[3] = {MlaAbsorbQKernel<1>, MlaAbsorbQKernel<2>,
                                              MlaAbsorbQKernel<kMlaAbsorbMaxRows>};
  LaunchAbsorb(a, kByRows, dim3(a.heads, a.rank / kAbsorbCols), stream);
  return true;
}

bool LaunchMlaAbsorbOut(const MlaAbsorbArgs& a, void* stream) {
  if (!MlaAbsorbOk(a)) return false;
  static constexpr AbsorbKernel kByRows[3] = {MlaAbsorbOutKernel<1>, MlaAbsorbOutKernel<2>,
                                              MlaAbsorbOutKernel<kMlaAbsorbMaxRows>};
  LaunchAbsorb(a, kByRows, dim3(a.heads * a.v_dim / kAbsorbWarps), stream);
  return true;
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
