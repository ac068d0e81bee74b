// The C8 attention tile kernel (internal; included by one .cu per cache type).
//
// One CTA = one work item (a query tile of one sequence x a KV chunk) for one KV head. The GQA
// group is packed into the tile's rows: row r is query token r / group, query head
// kv_head * group + r % group, so every K/V byte a CTA loads serves the whole group.
// KV tiles of 64 tokens stream through a two-stage cp.async ring; 8-bit tiles are converted to
// bf16 in shared memory right after landing; QK^T and PV run on tensor cores (mma.sync
// m16n8k16 bf16 -> fp32) with an online softmax in the log2 domain.
// Two warp layouts: decode (1 row group x 4 token groups: the four warps split each KV tile and
// merge at the end) and prefill (4 row groups x 1: each warp owns 16 rows, all warps share a tile).
// Scales: per-head K scale folds into the softmax scale; per-channel K scale folds into q; V
// scales (per head / channel) multiply the output; per-token (dynamic) scales multiply score
// columns (K) and probabilities (V).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/c8_kernel_args.h"

namespace llm::cuda::detail {

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, bool valid) {
  const int src_bytes = valid ? 16 : 0;  // 0: zero-fill (rows past the end must not hold NaNs)
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SmemAddr(smem)),
               "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(p)));
}
__device__ __forceinline__ void LdMatrixX4T(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(p)));
}

// c += a(16x16 bf16, row) * b(16x8 bf16, col)
__device__ __forceinline__ void Mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

struct Bf16Cache {
  static constexpr int kBytes = 2;
};
struct Int8Cache {
  static constexpr int kBytes = 1;
};
struct Fp8Cache {
  static constexpr int kBytes = 1;
};

// Converts 16 cached 8-bit values to 16 bf16 (exact: int8 and e4m3 values are bf16 values).
template <typename C>
__device__ __forceinline__ void Convert16(const uint8_t* src, __nv_bfloat16* dst) {
  const uint4 raw = *reinterpret_cast<const uint4*>(src);
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
  uint32_t outw[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (std::is_same_v<C, Int8Cache>) {
      const int8_t b0 = static_cast<int8_t>(w[i] & 0xff), b1 = static_cast<int8_t>((w[i] >> 8) & 0xff);
      const int8_t b2 = static_cast<int8_t>((w[i] >> 16) & 0xff), b3 = static_cast<int8_t>(w[i] >> 24);
      outw[2 * i] = PackBf16(static_cast<float>(b0), static_cast<float>(b1));
      outw[2 * i + 1] = PackBf16(static_cast<float>(b2), static_cast<float>(b3));
    } else {
      // Hardware e4m3x2 -> f16x2 conversion, then to bf16 (exact).
      const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(
          static_cast<__nv_fp8x2_storage_t>(w[i] & 0xffff), __NV_E4M3);
      const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(
          static_cast<__nv_fp8x2_storage_t>(w[i] >> 16), __NV_E4M3);
      const float2 flo = __half22float2(*reinterpret_cast<const __half2*>(&lo));
      const float2 fhi = __half22float2(*reinterpret_cast<const __half2*>(&hi));
      outw[2 * i] = PackBf16(flo.x, flo.y);
      outw[2 * i + 1] = PackBf16(fhi.x, fhi.y);
    }
  }
  uint4* d = reinterpret_cast<uint4*>(dst);
  d[0] = make_uint4(outw[0], outw[1], outw[2], outw[3]);
  d[1] = make_uint4(outw[4], outw[5], outw[6], outw[7]);
}

template <int D>
struct SmemLayout {
  static constexpr int kBfStride = D * 2 + 16;  // bytes per bf16 row (16 B pad: no bank conflicts)
  static constexpr int kRawStride8 = D + 16;    // bytes per 8-bit row
};

template <typename C, int D, int ROW_WARPS, int TOK_WARPS>
struct TileConfig {
  static constexpr int kWarps = ROW_WARPS * TOK_WARPS;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRows = 16 * ROW_WARPS;
  static constexpr bool kEight = C::kBytes == 1;
  static constexpr int kRawStride = kEight ? SmemLayout<D>::kRawStride8 : SmemLayout<D>::kBfStride;
  static constexpr int kRawTile = kTileTokens * kRawStride;      // bytes, one of K or V
  static constexpr int kBfTile = kTileTokens * SmemLayout<D>::kBfStride;
  // 2 stages x (K, V) raw, + (K, V) converted tiles for 8-bit, + per-token scales.
  static constexpr int kRawBytes = 2 * 2 * kRawTile;
  static constexpr int kConvBytes = kEight ? 2 * kBfTile : 0;
  static constexpr int kScaleBytes = 2 * 2 * kTileTokens * 4;
  static constexpr int kMergeBytes = TOK_WARPS > 1 ? kWarps * (16 * D + 32) * 4 : 0;
  static constexpr int kMainBytes = kRawBytes + kConvBytes + kScaleBytes;
  static constexpr int kSmemBytes = kMainBytes > kMergeBytes ? kMainBytes : kMergeBytes;
};

template <typename C, int D, int ROW_WARPS, int TOK_WARPS>
__global__ void __launch_bounds__(ROW_WARPS* TOK_WARPS * 32)
    C8TileKernel(const TileArgs args) {
  using Cfg = TileConfig<C, D, ROW_WARPS, TOK_WARPS>;
  constexpr int kBfStride = SmemLayout<D>::kBfStride;
  constexpr int kKSteps = D / 16;   // k-steps of QK^T
  constexpr int kNTiles = D / 8;    // n8 tiles of the output
  extern __shared__ __align__(16) uint8_t smem[];

  const C8WorkItem item = args.items[blockIdx.x];
  const int kvh = blockIdx.y;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int rw = warp / TOK_WARPS, tw = warp % TOK_WARPS;
  const int g = lane / 4, t = lane % 4;
  const int group = args.num_q_heads / args.num_kv_heads;
  const int D_ = D;

  uint8_t* raw = smem;                                   // [stage][K|V][tile]
  uint8_t* conv = smem + Cfg::kRawBytes;                 // [K|V][bf tile] (8-bit only)
  float* tok_scale = reinterpret_cast<float*>(smem + Cfg::kRawBytes + Cfg::kConvBytes);  // [stage][K|V][64]

  const int seq = item.seq;
  const int seq_q_begin = args.q_indptr[seq];
  const int seq_q_len = args.q_indptr[seq + 1] - seq_q_begin;
  const int kv_len = args.kv_lens[seq];
  const int32_t* pages = args.pages + args.page_indptr[seq];
  const int bs = args.block_size;

  // Rows this thread owns in the accumulator: g and g + 8 of its warp's 16.
  int row_pos[2];
  bool row_valid[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = rw * 16 + g + 8 * i;
    const int tok = r / group;
    row_valid[i] = tok < item.q_len;
    // Causal: query token at sequence position p sees keys [0, p].
    row_pos[i] = kv_len - seq_q_len + (item.q_start - seq_q_begin) + tok;
  }

  // Q fragments for this warp's 16 rows, with a per-channel K scale folded in.
  uint32_t qa[kKSteps][4];
  {
    const __nv_bfloat16* q = static_cast<const __nv_bfloat16*>(args.q);
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int r = rw * 16 + g + ((j & 1) ? 8 : 0);
        const int col = kk * 16 + 2 * t + ((j & 2) ? 8 : 0);
        const int tok = r / group, head = kvh * group + r % group;
        float x0 = 0.f, x1 = 0.f;
        if (tok < item.q_len) {
          const __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162*>(
              q + (static_cast<size_t>(item.q_start + tok) * args.num_q_heads + head) * D_ + col);
          x0 = __bfloat162float(v.x);
          x1 = __bfloat162float(v.y);
          if (args.scale_mode == static_cast<int>(ScaleMode::kPerChannel)) {
            x0 *= args.k_scale[kvh * D_ + col];
            x1 *= args.k_scale[kvh * D_ + col + 1];
          }
        }
        qa[kk][j] = PackBf16(x0, x1);
      }
    }
  }
  float scale_log2 = args.scale_log2;
  if (args.scale_mode == static_cast<int>(ScaleMode::kPerHead)) scale_log2 *= args.k_scale[kvh];
  const bool per_token = args.scale_mode == static_cast<int>(ScaleMode::kPerToken);

  float acc[kNTiles][4];
#pragma unroll
  for (int n = 0; n < kNTiles; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY};
  float l_run[2] = {0.f, 0.f};

  const int num_tiles = (item.kv_end - item.kv_start + kTileTokens - 1) / kTileTokens;
  constexpr int kChunksPerRow = D * C::kBytes / 16;

  auto load_tile = [&](int stage, int tile) {
    const int base = item.kv_start + tile * kTileTokens;
    for (int idx = tid; idx < kTileTokens * kChunksPerRow * 2; idx += Cfg::kThreads) {
      const int kv = idx / (kTileTokens * kChunksPerRow);  // 0: K, 1: V
      const int rem = idx % (kTileTokens * kChunksPerRow);
      const int row = rem / kChunksPerRow, chunk = rem % kChunksPerRow;
      const int j = base + row;
      const bool valid = j < item.kv_end;
      const int jj = valid ? j : item.kv_start;
      const size_t elem = ((static_cast<size_t>(pages[jj / bs]) * args.num_kv_heads + kvh) * bs +
                           jj % bs) * D_ + chunk * (16 / C::kBytes);
      const uint8_t* src =
          static_cast<const uint8_t*>(kv ? args.v_cache : args.k_cache) + elem * C::kBytes;
      uint8_t* dst = raw + (stage * 2 + kv) * Cfg::kRawTile + row * Cfg::kRawStride + chunk * 16;
      CpAsync16(dst, src, valid);
    }
    if (per_token) {
      for (int idx = tid; idx < 2 * kTileTokens; idx += Cfg::kThreads) {
        const int kv = idx / kTileTokens, row = idx % kTileTokens;
        const int j = base + row;
        float s = 0.f;
        if (j < item.kv_end) {
          const float* sc = kv ? args.v_scale : args.k_scale;
          s = sc[(static_cast<size_t>(pages[j / bs]) * args.num_kv_heads + kvh) * bs + j % bs];
        }
        tok_scale[(stage * 2 + kv) * kTileTokens + row] = s;
      }
    }
  };

  if (num_tiles > 0) load_tile(0, 0);
  CpAsyncCommit();
  for (int tile = 0; tile < num_tiles; ++tile) {
    const int stage = tile & 1;
    if (tile + 1 < num_tiles) {
      load_tile(stage ^ 1, tile + 1);
      CpAsyncCommit();
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();
    const uint8_t* k_tile;
    const uint8_t* v_tile;
    if constexpr (Cfg::kEight) {
      // Dequantize in shared memory right after landing: 16 values per thread per step.
      constexpr int kChunks = kTileTokens * (D / 16);
      for (int idx = tid; idx < 2 * kChunks; idx += Cfg::kThreads) {
        const int kv = idx / kChunks, rem = idx % kChunks;
        const int row = rem / (D / 16), c = rem % (D / 16);
        Convert16<C>(raw + (stage * 2 + kv) * Cfg::kRawTile + row * Cfg::kRawStride + c * 16,
                     reinterpret_cast<__nv_bfloat16*>(conv + kv * Cfg::kBfTile + row * kBfStride) +
                         c * 16);
      }
      __syncthreads();
      k_tile = conv;
      v_tile = conv + Cfg::kBfTile;
    } else {
      k_tile = raw + (stage * 2 + 0) * Cfg::kRawTile;
      v_tile = raw + (stage * 2 + 1) * Cfg::kRawTile;
    }
    const float* ks = tok_scale + (stage * 2 + 0) * kTileTokens;
    const float* vs = tok_scale + (stage * 2 + 1) * kTileTokens;
    const int tile_base = item.kv_start + tile * kTileTokens;

    constexpr int kStepsPerWarp = kTileTokens / 16 / TOK_WARPS;
#pragma unroll
    for (int st = 0; st < kStepsPerWarp; ++st) {
      const int n0 = (tw * kStepsPerWarp + st) * 16;  // first token of this 16-token step
      if (tile_base + n0 >= item.kv_end) break;
      float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
      for (int kk = 0; kk < kKSteps; ++kk) {
        uint32_t b[4];
        const int mi = lane / 8, rr = lane % 8;
        LdMatrixX4(b, k_tile + (n0 + rr + (mi >= 2 ? 8 : 0)) * kBfStride +
                          (kk * 16 + (mi & 1) * 8) * 2);
        Mma16816(s[0], qa[kk], b[0], b[1]);
        Mma16816(s[1], qa[kk], b[2], b[3]);
      }
      // Scale, mask, online softmax. s[n][0..1]: row g, s[n][2..3]: row g+8;
      // column (token) n0 + n*8 + 2t + (e & 1).
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int n = 0; n < 2; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = n0 + n * 8 + 2 * t + (e & 1);
          const int j = tile_base + col;
          const int ri = e >> 1;
          float v = s[n][e] * scale_log2;
          if (per_token) v *= ks[col];
          if (j >= item.kv_end || j > row_pos[ri]) v = -INFINITY;
          s[n][e] = v;
          mx[ri] = fmaxf(mx[ri], v);
        }
      }
      float alpha[2];
#pragma unroll
      for (int ri = 0; ri < 2; ++ri) {
        mx[ri] = fmaxf(mx[ri], __shfl_xor_sync(0xffffffff, mx[ri], 1));
        mx[ri] = fmaxf(mx[ri], __shfl_xor_sync(0xffffffff, mx[ri], 2));
        const float m_new = fmaxf(m_run[ri], mx[ri]);
        const float m_use = m_new == -INFINITY ? 0.f : m_new;  // fully masked so far: no NaN
        alpha[ri] = exp2f(m_run[ri] - m_use);
        m_run[ri] = m_new;
        l_run[ri] *= alpha[ri];
        mx[ri] = m_use;
      }
      uint32_t pa[4];
      {
        float p[2][4];
#pragma unroll
        for (int n = 0; n < 2; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int ri = e >> 1;
            p[n][e] = exp2f(s[n][e] - mx[ri]);
            l_run[ri] += p[n][e];
            if (per_token) p[n][e] *= vs[n0 + n * 8 + 2 * t + (e & 1)];
          }
        }
        pa[0] = PackBf16(p[0][0], p[0][1]);
        pa[1] = PackBf16(p[0][2], p[0][3]);
        pa[2] = PackBf16(p[1][0], p[1][1]);
        pa[3] = PackBf16(p[1][2], p[1][3]);
      }
#pragma unroll
      for (int n = 0; n < kNTiles; ++n) {
        acc[n][0] *= alpha[0];
        acc[n][1] *= alpha[0];
        acc[n][2] *= alpha[1];
        acc[n][3] *= alpha[1];
      }
#pragma unroll
      for (int dd = 0; dd < D / 16; ++dd) {
        uint32_t b[4];
        const int mi = lane / 8, rr = lane % 8;
        LdMatrixX4T(b, v_tile + (n0 + rr + (mi & 1) * 8) * kBfStride + (dd * 16 + (mi >> 1) * 8) * 2);
        Mma16816(acc[2 * dd], pa, b[0], b[1]);
        Mma16816(acc[2 * dd + 1], pa, b[2], b[3]);
      }
    }
    __syncthreads();  // the next iteration's loads overwrite this stage
  }

  // Row sums: each thread summed only its own columns.
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    l_run[ri] += __shfl_xor_sync(0xffffffff, l_run[ri], 1);
    l_run[ri] += __shfl_xor_sync(0xffffffff, l_run[ri], 2);
  }

  // Final per-element write: value is the normalized output of (row r, dim d) with its log2-sum-exp.
  auto emit = [&](int r, int d, float v0, float v1, float lse) {
    const int tok = r / group, head = kvh * group + r % group;
    if (tok >= item.q_len) return;
    if (args.scale_mode == static_cast<int>(ScaleMode::kPerHead)) {
      v0 *= args.v_scale[kvh];
      v1 *= args.v_scale[kvh];
    } else if (args.scale_mode == static_cast<int>(ScaleMode::kPerChannel)) {
      v0 *= args.v_scale[kvh * D_ + d];
      v1 *= args.v_scale[kvh * D_ + d + 1];
    }
    if (item.partial < 0) {
      __nv_bfloat16* out = static_cast<__nv_bfloat16*>(args.out) +
                           (static_cast<size_t>(item.q_start + tok) * args.num_q_heads + head) * D_ + d;
      *reinterpret_cast<__nv_bfloat162*>(out) = __floats2bfloat162_rn(v0, v1);
    } else {
      const size_t prow = (static_cast<size_t>(item.partial) * args.num_kv_heads + kvh) * kPartialRows + r;
      args.partial_o[prow * D_ + d] = v0;
      args.partial_o[prow * D_ + d + 1] = v1;
      if (d == 0) args.partial_lse[prow] = lse;
    }
  };

  if constexpr (TOK_WARPS == 1) {
#pragma unroll
    for (int ri = 0; ri < 2; ++ri) {
      const int r = rw * 16 + g + 8 * ri;
      const float inv = l_run[ri] > 0.f ? 1.f / l_run[ri] : 0.f;
      const float lse = l_run[ri] > 0.f ? m_run[ri] + log2f(l_run[ri]) : -INFINITY;
#pragma unroll
      for (int n = 0; n < kNTiles; ++n) {
        emit(r, n * 8 + 2 * t, acc[n][2 * ri] * inv, acc[n][2 * ri + 1] * inv, lse);
      }
    }
  } else {
    // Merge the token-split warps through shared memory (the KV tiles are no longer needed).
    float* ms = reinterpret_cast<float*>(smem);  // [warp][16] m, then [warp][16] l, then acc
    float* ls = ms + Cfg::kWarps * 16;
    float* as = ls + Cfg::kWarps * 16;  // [warp][16][D]
    __syncthreads();
    if (t == 0) {
      ms[warp * 16 + g] = m_run[0];
      ms[warp * 16 + g + 8] = m_run[1];
      ls[warp * 16 + g] = l_run[0];
      ls[warp * 16 + g + 8] = l_run[1];
    }
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
      float* a0 = as + (warp * 16 + g) * D + n * 8 + 2 * t;
      float* a1 = as + (warp * 16 + g + 8) * D + n * 8 + 2 * t;
      a0[0] = acc[n][0];
      a0[1] = acc[n][1];
      a1[0] = acc[n][2];
      a1[1] = acc[n][3];
    }
    __syncthreads();
    for (int idx = tid; idx < 16 * D / 2; idx += Cfg::kThreads) {
      const int r = idx / (D / 2), d = (idx % (D / 2)) * 2;
      float m = -INFINITY;
#pragma unroll
      for (int w = 0; w < Cfg::kWarps; ++w) m = fmaxf(m, ms[w * 16 + r]);
      const float m_use = m == -INFINITY ? 0.f : m;
      float l = 0.f, v0 = 0.f, v1 = 0.f;
#pragma unroll
      for (int w = 0; w < Cfg::kWarps; ++w) {
        const float f = exp2f(ms[w * 16 + r] - m_use);
        l += ls[w * 16 + r] * f;
        v0 += as[(w * 16 + r) * D + d] * f;
        v1 += as[(w * 16 + r) * D + d + 1] * f;
      }
      const float inv = l > 0.f ? 1.f / l : 0.f;
      emit(r, d, v0 * inv, v1 * inv, l > 0.f ? m_use + log2f(l) : -INFINITY);
    }
  }
}

template <typename C, int D>
void LaunchTilesImpl(const TileArgs& a, bool prefill, void* stream) {
  if (a.num_items == 0) return;
  const dim3 grid(a.num_items, a.num_kv_heads);
  auto s = static_cast<cudaStream_t>(stream);
  if (prefill) {
    using Cfg = TileConfig<C, D, 4, 1>;
    auto k = C8TileKernel<C, D, 4, 1>;
    cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
    k<<<grid, Cfg::kThreads, Cfg::kSmemBytes, s>>>(a);
  } else {
    using Cfg = TileConfig<C, D, 1, 4>;
    auto k = C8TileKernel<C, D, 1, 4>;
    cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
    k<<<grid, Cfg::kThreads, Cfg::kSmemBytes, s>>>(a);
  }
}

template <typename C>
void LaunchTilesForCache(const TileArgs& a, int head_dim, bool prefill, void* stream) {
  if (head_dim == 64) {
    LaunchTilesImpl<C, 64>(a, prefill, stream);
  } else {
    LaunchTilesImpl<C, 128>(a, prefill, stream);
  }
}

}  // namespace llm::cuda::detail
