// KV append (quantizing, optionally with the rotary fused in) kernel for C8 attention. (Split-KV
// chunks are merged inside the tile kernel: c8_tile_kernel.cuh.)
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/cuda/c8/c8_append_row.cuh"
#include "kernels/cuda/c8/c8_kernel_args.h"
#include "kernels/cuda/common/pdl_launch.cuh"
#include "kernels/cuda/common/ptx_ops.cuh"
#include "kernels/cuda/ops/rope_pairs.cuh"

namespace llm::cuda::detail {
namespace {

// One CTA per token; D / 8 consecutive threads per head, each holding four (i, i + D/2) pairs.
// kRope: the heads are the raw fused projection's (q, then k, then v; q and k normalized where
// the q/k norms are given, then rotated, q written out), so the norms, the rotary and the append
// are one launch. Otherwise the heads are k_new's and v_new's.
// K and V are rounded to bf16 before quantizing: the cache holds what a separate rotary kernel's
// bf16 output quantizes to.
template <int D, bool kRope>
__global__ void AppendKernel(const RopeAppendArgs a, int cache_type) {
  constexpr int kHalf = D / 2, kLanes = D / 8;
  static_assert(32 % kLanes == 0, "a head's lanes inside one warp (the q/k norm's butterfly)");
  __shared__ float cs[D];  // cos, sin of this token's angles (kRope)
  const AppendArgs& c = a.cache;
  const int t = blockIdx.x, hkv = c.num_kv_heads;
  const int hq = kRope ? a.num_q_heads : 0;
  const int heads = hq + 2 * hkv;
  // Positions, frequencies and slots were uploaded before the step: the angles are computed
  // while the previous kernel (the q/k/v projection) finishes.
  if constexpr (kRope) {
    rope::FillAngles(static_cast<float>(a.rope.positions[t]), a.rope.inv_freq, kHalf, cs);
  }
  ptx::GridDependencySync();  // launched with LaunchPdl
  float rs = 1.f;
  const __nv_bfloat16* row = nullptr;
  if constexpr (kRope) {
    __syncthreads();
    rs = a.rope.qkv_scale ? a.rope.qkv_scale[t] : 1.f;
    row = static_cast<const __nv_bfloat16*>(a.rope.qkv) + static_cast<size_t>(t) * heads * D;
  }
  const int slot = c.slots[t];  // -1: a graph bucket's padding row, nothing appended
  const int block = slot / c.block_size, off = slot % c.block_size;
  // Uniform trip count: the per-token scale's shuffles need every lane of the warp.
  for (int base = 0; base < heads * kLanes; base += blockDim.x) {
    const int idx = base + threadIdx.x;
    const bool valid = idx < heads * kLanes;
    const int h = valid ? idx / kLanes : 0, i = (idx % kLanes) * 4;
    float x1[4] = {}, x2[4] = {};
    if (valid) {
      if constexpr (kRope) {
        rope::LoadPairs(row, static_cast<const __nv_bfloat16*>(a.rope.bias), h * D + i, kHalf, rs,
                        x1, x2);
      } else {
        const void* src = h < hkv ? c.k_new : c.v_new;
        const size_t r = (static_cast<size_t>(t) * hkv + h % hkv) * D;
        rope::LoadPairs(static_cast<const __nv_bfloat16*>(src) + r, nullptr, i, kHalf, 1.f, x1, x2);
      }
    }
    if constexpr (kRope) {
      // q / k RMSNorm per head (both weights or neither): the head's kLanes lanes sum their
      // squares by a butterfly inside the warp (every lane takes part; v heads and invalid lanes
      // discard theirs), as the model's q/k-norm rotary kernel sums them.
      if (a.rope.q_norm != nullptr) {
        float ss = rope::SumSquares(x1, x2);
#pragma unroll
        for (int o = kLanes / 2; o > 0; o >>= 1) {
          ss = __fadd_rn(ss, __shfl_xor_sync(0xffffffffu, ss, o));
        }
        if (valid && h < hq + hkv) {
          const auto* w = static_cast<const __nv_bfloat16*>(h < hq ? a.rope.q_norm : a.rope.k_norm);
          rope::NormPairs(w, i, kHalf, rsqrtf(ss / D + a.rope.norm_eps), a.rope.norm_offset, x1,
                          x2);
        }
      }
      if (valid && h < hq + hkv) rope::Rotate(cs, i, kHalf, x1, x2);
    }
    if (valid && h < hq) {
      auto* q = static_cast<__nv_bfloat16*>(a.rope.q) + (static_cast<size_t>(t) * hq + h) * D;
      ptx::StoreBf16x4(q + i, x1);
      ptx::StoreBf16x4(q + i + kHalf, x2);
    }
    const bool store = valid && h >= hq && slot >= 0;
    const bool is_v = h >= hq + hkv;
    const int kh = store ? h - hq - (is_v ? hkv : 0) : 0;
    const AppendRowDst dst{is_v ? c.v_cache : c.k_cache, is_v ? c.v_scale : c.k_scale, kh,
                           (static_cast<size_t>(block) * hkv + kh) * c.block_size + off};
    AppendRowPart<kLanes>(x1, x2, store, cache_type, c.scale_mode, i, kHalf, dst);
  }
}

template <bool kRope>
void Launch(const RopeAppendArgs& a, CacheType cache, int head_dim, void* stream) {
  const int heads = (kRope ? a.num_q_heads : 0) + 2 * a.cache.num_kv_heads;
  const int threads = std::min(1024, (heads * head_dim / 8 + 31) / 32 * 32);
  auto s = static_cast<cudaStream_t>(stream);
  auto kernel = head_dim == 64 ? AppendKernel<64, kRope> : AppendKernel<128, kRope>;
  (void)LaunchPdl(kernel, dim3(a.cache.num_tokens), dim3(threads), 0, s, a,
                  static_cast<int>(cache));
}

}  // namespace

void LaunchAppend(const AppendArgs& a, CacheType cache, int head_dim, void* stream) {
  if (a.num_tokens == 0) return;
  RopeAppendArgs ra{};
  ra.cache = a;
  Launch<false>(ra, cache, head_dim, stream);
}

void LaunchRopeAppend(const RopeAppendArgs& a, CacheType cache, int head_dim, void* stream) {
  if (a.cache.num_tokens == 0) return;
  Launch<true>(a, cache, head_dim, stream);
}

}  // namespace llm::cuda::detail
