// The C8 attention tile kernel (internal; included by one .cu per cache type).
//
// One CTA = one work item (a query tile of one sequence x a KV chunk) for one KV head. The GQA
// group is packed into the tile's rows: row r is query token r / group, query head
// kv_head * group + r % group, so every K/V byte a CTA loads serves the whole group.
// KV tiles (64 tokens for bf16, 128 for 8-bit) stream through a cp.async ring (two stages for
// prefill; two to four for decode, chosen per plan: Cfg::kStages); each thread copies one 16-byte
// column of a few consecutive rows of one page, so it looks up one page id per tile. 8-bit tiles
// stay 8-bit in shared memory and are dequantized in registers after ldmatrix. QK^T and PV run
// on tensor cores (mma.sync m16n8k16 -> fp32) with an online softmax whose running max moves
// lazily (only when a row's max grows by 2^8), so most steps skip the accumulator rescale. Two
// warp layouts: decode (1 row group x 4 token groups: the four warps split each KV tile and merge
// at the end; each warp copies only its own token slice, so its ring syncs per warp) and prefill
// (8 row groups x 1: each warp owns 16 rows, all warps share a tile behind CTA barriers).
// Outputs are staged in shared memory and written as 16-byte rows. Scales: per-head K scale
// folds into the softmax scale; per-channel K scale folds into q; V scales (per head / channel)
// multiply the output; per-token (dynamic) scales multiply score columns (K) and probabilities
// (V), in a separate instantiation.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/c8_kernel_args.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/pdl_launch.cuh"
#include "kernels/cuda/ptx_ops.cuh"

namespace llm::cuda::detail {

using ptx::CpAsync16;
using ptx::CpAsync4;
using ptx::CpAsyncCommit;
using ptx::CpAsyncWait;
using ptx::LdMatrixX4;
using ptx::LdMatrixX4T;
using ptx::MmaBf16;
using ptx::MmaF16;
using ptx::PackBf16;
using ptx::PackF16;
using ptx::SmemAddr;
using ptx::StoreBf16x4;

// Cache-type traits. The bf16 cache feeds bf16 tensor cores directly. 8-bit caches stay 8-bit in
// shared memory and are dequantized in registers right after ldmatrix (int8 by the 0x6400
// magic-number trick, e4m3 by the hardware f16x2 conversion) into fp16 fragments; both are exact.
// Loading 8-bit data with ldmatrix permutes which d (for K) and which output column (for V) a
// thread holds; q is loaded with the same permutation and the output is un-permuted at the end.
// kDecodeStages: the decode layout's ring depth when the plan does not pick one (prefill keeps
// 2). The planner picks 2, 3 or 4 stages per step from the grid (BuildC8Plan): a 3-stage ring
// (106 KB for bf16 at d = 128, 111 KB for 8-bit: 2 CTAs per SM on Hopper) keeps two tiles in
// flight per CTA, a 4-stage ring three at one CTA per SM. A ring runs only where a block may have
// that much shared memory, else the next shallower one (DecodeStages).
struct Bf16Cache {
  static constexpr int kBytes = 2;
  static constexpr int kTile = kKvTile16;  // KV tokens per shared-memory stage
  static constexpr int kDecodeStages = 3;
};
struct Int8Cache {
  static constexpr int kBytes = 1;
  static constexpr int kTile = kKvTile8;
  static constexpr int kDecodeStages = 2;
};
struct Fp8Cache {
  static constexpr int kBytes = 1;
  static constexpr int kTile = kKvTile8;
  static constexpr int kDecodeStages = 2;
};

// Two bytes of a 32-bit word (selected by a __byte_perm selector) -> f16x2. int8 values are
// stored excess-128 (byte = q ^ 0x80 = q + 128), so placing a byte in the mantissa of 1024.0
// gives 1024 + q + 128 = q + 1152, exact in fp16. kOffset: keep the +1152 (K: q.(k + 1152)
// shifts a row's scores by a constant, which softmax ignores; V: the caller subtracts
// 1152 x sum(P) at the end); otherwise subtract it here.
template <typename C, bool kOffset = false>
__device__ __forceinline__ uint32_t Bytes2ToF16x2(uint32_t w, uint32_t sel_int8, uint32_t sel_fp8) {
  if constexpr (std::is_same_v<C, Int8Cache>) {
    const uint32_t h = __byte_perm(w, 0x64646464u, sel_int8);
    if constexpr (kOffset) return h;
    __half2 v = *reinterpret_cast<const __half2*>(&h);
    v = __hsub2(v, __halves2half2(__ushort_as_half(0x6480), __ushort_as_half(0x6480)));
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    const uint32_t pair = __byte_perm(w, 0u, sel_fp8) & 0xffffu;
    const __half2_raw r =
        __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair), __NV_E4M3);
    return *reinterpret_cast<const uint32_t*>(&r);
  }
}

template <typename C, int D>
struct Frag {
  static constexpr bool kEight = C::kBytes == 1;
  static constexpr int kRowBytes = D * C::kBytes + 16;  // 16 B pad: conflict-free ldmatrix
  static constexpr int kNTiles = D / 8;

  __device__ static void Mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    if constexpr (kEight)
      MmaF16(c, a, b0, b1);
    else
      MmaBf16(c, a, b0, b1);
  }
  __device__ static uint32_t Pack(float lo, float hi) {
    if constexpr (kEight)
      return PackF16(lo, hi);
    else
      return PackBf16(lo, hi);
  }
  // Physical d of the q element a thread loads for fragment register j (0..3), pair element e.
  __device__ static int QCol(int kk, int t, int j) {
    if constexpr (kEight)
      return kk * 16 + 4 * t + ((j & 2) ? 2 : 0);
    else
      return kk * 16 + 2 * t + ((j & 2) ? 8 : 0);
  }
  // Row (0..15 within the warp) and physical d of accumulator element acc[n][e].
  __device__ static void AccCoord(int n, int e, int g, int t, int* row, int* d) {
    *row = g + 8 * (e >> 1);
    if constexpr (kEight)
      *d = (n >> 1) * 16 + 4 * t + 2 * (e & 1) + (n & 1);
    else
      *d = n * 8 + 2 * t + (e & 1);
  }
  // S[16 x 16 tokens starting at n0] += q . K^T
  // kOffsetK: int8 K may carry the +1152 offset (only when scores are not scaled per token).
  template <bool kOffsetK>
  __device__ static void QK(float (&s)[2][4], const uint32_t (*qa)[4], const uint8_t* k_tile,
                            int n0, int lane) {
    const int mi = lane / 8, rr = lane % 8;
    if constexpr (kEight) {
#pragma unroll
      for (int c = 0; c < D / 32; ++c) {  // two k-steps per ldmatrix.x4
        uint32_t r[4];
        LdMatrixX4(r, k_tile + (n0 + rr + (mi & 1) * 8) * kRowBytes + c * 32 + (mi >> 1) * 16);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
          for (int nt = 0; nt < 2; ++nt) {
            const uint32_t w = r[h * 2 + nt];
            Mma(s[nt], qa[2 * c + h], Bytes2ToF16x2<C, kOffsetK>(w, 0x4140, 0x0010),
                Bytes2ToF16x2<C, kOffsetK>(w, 0x4342, 0x0032));
          }
        }
      }
    } else {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t b[4];
        LdMatrixX4(
            b, k_tile + (n0 + rr + (mi >= 2 ? 8 : 0)) * kRowBytes + (kk * 16 + (mi & 1) * 8) * 2);
        Mma(s[0], qa[kk], b[0], b[1]);
        Mma(s[1], qa[kk], b[2], b[3]);
      }
    }
  }
  // int8 V keeps its +1152 offset in the product; psum (sum of the fp16 P actually multiplied,
  // by one more mma against ones) removes it at the end.
  static constexpr bool kVOffset = std::is_same_v<C, Int8Cache>;
  __device__ static void RowSums(float (&psum)[4], const uint32_t (&pa)[4]) {
    if constexpr (kVOffset) MmaF16(psum, pa, 0x3c003c00u, 0x3c003c00u);  // B = ones (fp16 1.0)
  }
  // acc += P[16 x 16 tokens starting at n0] . V
  __device__ static void PV(float (*acc)[4], const uint32_t (&pa)[4], const uint8_t* v_tile, int n0,
                            int lane) {
    const int mi = lane / 8, rr = lane % 8;
    if constexpr (kEight) {
#pragma unroll
      for (int j = 0; j < D / 32; ++j) {  // 32 d per ldmatrix.x4.trans
        uint32_t r[4];
        LdMatrixX4T(r, v_tile + (n0 + rr + (mi & 1) * 8) * kRowBytes + j * 32 + (mi >> 1) * 16);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int blk = 2 * j + h;                        // 16-d block
          const uint32_t lo = r[2 * h], hi = r[2 * h + 1];  // tokens 0-7 and 8-15
          Mma(acc[2 * blk], pa, Bytes2ToF16x2<C, kVOffset>(lo, 0x4240, 0x0020),
              Bytes2ToF16x2<C, kVOffset>(hi, 0x4240, 0x0020));
          Mma(acc[2 * blk + 1], pa, Bytes2ToF16x2<C, kVOffset>(lo, 0x4341, 0x0031),
              Bytes2ToF16x2<C, kVOffset>(hi, 0x4341, 0x0031));
        }
      }
    } else {
#pragma unroll
      for (int dd = 0; dd < D / 16; ++dd) {
        uint32_t b[4];
        LdMatrixX4T(b,
                    v_tile + (n0 + rr + (mi & 1) * 8) * kRowBytes + (dd * 16 + (mi >> 1) * 8) * 2);
        Mma(acc[2 * dd], pa, b[0], b[1]);
        Mma(acc[2 * dd + 1], pa, b[2], b[3]);
      }
    }
  }
};

template <typename C, int D, int ROW_WARPS, int TOK_WARPS, int STAGES = 2>
struct TileConfig {
  static constexpr int kWarps = ROW_WARPS * TOK_WARPS;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRows = 16 * ROW_WARPS;
  static constexpr int kTile = C::kTile;
  static constexpr int kRowBytes = Frag<C, D>::kRowBytes;
  static constexpr int kTileBytes = kTile * kRowBytes;        // one of K or V, one stage
  static constexpr int kStages = STAGES;                      // cp.async ring depth
  static constexpr int kRawBytes = kStages * 2 * kTileBytes;  // stages x (K, V)
  static constexpr int kScaleBytes = kStages * 2 * kTile * 4;
  // Token-split merge: [warp][16] m, [warp][16] l, [warp][16] factors, [warp][16][D] acc.
  static constexpr int kMergeBytes = TOK_WARPS > 1 ? kWarps*(16 * D + 48) * 4 : 0;
  static constexpr int kMainBytes = kRawBytes + kScaleBytes;
  static constexpr int kSmemBytes = kMainBytes > kMergeBytes ? kMainBytes : kMergeBytes;
  // Copy mapping: each thread copies one 16-byte column chunk of kRowsPerThread consecutive
  // rows, which lie in one page (pages hold at least 8 tokens and tiles start page-aligned), so a
  // thread looks up one page per tile and its row addresses are constant strides.
  static constexpr int kChunksPerRow = D * C::kBytes / 16;
  static constexpr int kRowGroups = kThreads / kChunksPerRow;
  static constexpr int kRowsPerThread = kTile / kRowGroups;
  static_assert(kThreads % kChunksPerRow == 0 && kTile % kRowGroups == 0, "tile mapping");
  static_assert(kRowsPerThread <= 8, "a thread's rows must fit the smallest page (8 tokens)");
  // Decode layout (one row group): warp w copies rows [w, w + 1) x kTile / kWarps of each tile,
  // exactly the token slice it reads, so the ring needs only warp-level synchronization and the
  // warps drift apart instead of meeting at a CTA barrier twice per tile (2-4% faster on the
  // 2- and 3-stage rings of full batches; the 4-stage ring of tiny split grids was 3% slower
  // with it, so it keeps the CTA barrier).
  static constexpr bool kWarpPrivateRows = ROW_WARPS == 1 && STAGES <= 3;
  static_assert(!kWarpPrivateRows || (32 % kChunksPerRow == 0 &&
                                      (32 / kChunksPerRow) * kRowsPerThread == kTile / TOK_WARPS),
                "each warp's copies cover exactly the rows it reads");
};

// The ring's barrier: a stage's copies are complete and visible (after CpAsyncWait), or every
// reader of a stage is done with it (before it is refilled).
template <typename Cfg>
__device__ __forceinline__ void RingSync() {
  if constexpr (Cfg::kWarpPrivateRows) {
    __syncwarp();
  } else {
    __syncthreads();
  }
}

// Online softmax over one 16-token step of a warp's 16 rows. s[n][e]: raw scores (q.k, with
// per-token K scales applied); row g (e < 2) or g + 8 (e >= 2), token n0 + n*8 + 2t + (e & 1).
// The running max is kept in raw-score units and only moves when a row's max grows by more than
// kLazyLog2 in the exp2 domain, so most steps skip the accumulator rescale; probabilities then
// reach at most 2^kLazyLog2, well inside fp16/bf16 range. Returns P as an mma A fragment.
constexpr float kLazyLog2 = 8.f;

// vs: per-token V scales of the step's 16 tokens (kPerToken), folded into P after l is summed.
template <typename F, bool kMask, bool kPerToken, int kNTiles>
__device__ __forceinline__ void SoftmaxStep(float (&s)[2][4], float (&m_run)[2], float (&l_run)[2],
                                            float (&acc)[kNTiles][4], float (&psum)[4],
                                            uint32_t (&pa)[4], float scale_log2, float lazy_raw,
                                            int col0, int kv_end, const int (&row_pos)[2], int t,
                                            const float* vs) {
  if constexpr (kMask) {
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int j = col0 + n * 8 + 2 * t + (e & 1);
        if (j >= kv_end || j > row_pos[e >> 1]) s[n][e] = -INFINITY;
      }
    }
  }
  float mx[2];
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    mx[ri] = fmaxf(fmaxf(s[0][2 * ri], s[0][2 * ri + 1]), fmaxf(s[1][2 * ri], s[1][2 * ri + 1]));
    mx[ri] = fmaxf(mx[ri], __shfl_xor_sync(0xffffffff, mx[ri], 1));
    mx[ri] = fmaxf(mx[ri], __shfl_xor_sync(0xffffffff, mx[ri], 2));
  }
  // A row whose max grew past the slack (or that saw its first visible key) moves its max.
  const bool grow0 = mx[0] > m_run[0] + lazy_raw, grow1 = mx[1] > m_run[1] + lazy_raw;
  if (__any_sync(0xffffffff, grow0 || grow1)) {
    float alpha[2];
    const bool grow[2] = {grow0, grow1};
#pragma unroll
    for (int ri = 0; ri < 2; ++ri) {
      const float m_new = grow[ri] ? mx[ri] : m_run[ri];
      alpha[ri] = m_run[ri] == -INFINITY ? 0.f : ptx::Exp2Ftz((m_run[ri] - m_new) * scale_log2);
      m_run[ri] = m_new;
      l_run[ri] *= alpha[ri];
    }
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
      acc[n][0] *= alpha[0];
      acc[n][1] *= alpha[0];
      acc[n][2] *= alpha[1];
      acc[n][3] *= alpha[1];
    }
    psum[0] *= alpha[0];
    psum[1] *= alpha[0];
    psum[2] *= alpha[1];
    psum[3] *= alpha[1];
  }
  // A fully masked row so far keeps m = -inf: its probabilities must come out 0, not NaN.
  float neg_m[2];
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) neg_m[ri] = m_run[ri] == -INFINITY ? 0.f : -m_run[ri] * scale_log2;
  float p[2][4];
#pragma unroll
  for (int n = 0; n < 2; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      p[n][e] = ptx::Exp2Ftz(fmaf(s[n][e], scale_log2, neg_m[e >> 1]));
      l_run[e >> 1] += p[n][e];
      if constexpr (kPerToken) p[n][e] *= vs[n * 8 + 2 * t + (e & 1)];
    }
  }
  pa[0] = F::Pack(p[0][0], p[0][1]);
  pa[1] = F::Pack(p[0][2], p[0][3]);
  pa[2] = F::Pack(p[1][0], p[1][1]);
  pa[3] = F::Pack(p[1][2], p[1][3]);
}

// Combines the chunks of one split query tile for one KV head (rows: its query rows), run by the
// CTA that finished the tile's last chunk. Partials come from other CTAs: loads bypass L1.
template <int D, int kThreads, int kRows>
__device__ void MergeChunks(const TileArgs& args, const C8MergeItem& mi, int kvh, int group,
                            int rows, uint8_t* smem) {
  static_assert(kRows * kMaxSplits * 4 <= 32 * 1024, "merge weights fit the tile's shared memory");
  float* w = reinterpret_cast<float*>(smem);  // [kRows][kMaxSplits] chunk weights
  const int n = min(mi.num_partials, kMaxSplits);
  auto prow = [&](int p, int r) {
    return (static_cast<size_t>(mi.first_partial + p) * args.num_kv_heads + kvh) * kPartialRows + r;
  };
  for (int r = threadIdx.x; r < rows; r += kThreads) {
    float* wr = w + r * kMaxSplits;
    float m = -INFINITY;
    for (int p = 0; p < n; ++p) {
      wr[p] = __ldcg(args.partial_lse + prow(p, r));
      m = fmaxf(m, wr[p]);
    }
    const float m_use = m == -INFINITY ? 0.f : m;
    float sum = 0.f;
    for (int p = 0; p < n; ++p) {
      wr[p] = ptx::Exp2Ftz(wr[p] - m_use);
      sum += wr[p];
    }
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    for (int p = 0; p < n; ++p) wr[p] *= inv;
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < rows * (D / 4); idx += kThreads) {
    const int r = idx / (D / 4), d0 = (idx % (D / 4)) * 4;
    float o[4] = {0.f, 0.f, 0.f, 0.f};
    for (int p = 0; p < n; ++p) {
      const float f = w[r * kMaxSplits + p];
      const float4 a =
          __ldcg(reinterpret_cast<const float4*>(args.partial_o + prow(p, r) * D + d0));
      o[0] += f * a.x;
      o[1] += f * a.y;
      o[2] += f * a.z;
      o[3] += f * a.w;
    }
    const int tok = r / group, head = kvh * group + r % group;
    StoreBf16x4(static_cast<__nv_bfloat16*>(args.out) +
                    (static_cast<size_t>(mi.q_start + tok) * args.num_q_heads + head) * D + d0,
                o);
  }
}

template <typename C, int D, int ROW_WARPS, int TOK_WARPS, bool kPerToken, int STAGES>
__global__ void __launch_bounds__(ROW_WARPS* TOK_WARPS * 32) C8TileKernel(const TileArgs args) {
  using Cfg = TileConfig<C, D, ROW_WARPS, TOK_WARPS, STAGES>;
  using F = Frag<C, D>;
  constexpr int kTile = Cfg::kTile;
  constexpr int kKSteps = D / 16;
  constexpr int kNTiles = D / 8;
  extern __shared__ __align__(16) uint8_t smem[];

  if (args.device_num_items != nullptr && static_cast<int>(blockIdx.x) >= *args.device_num_items) {
    return;
  }
  C8WorkItem item;
  {  // two 16-byte loads (the item array is 16-byte aligned)
    const int4* src = reinterpret_cast<const int4*>(args.items + blockIdx.x);
    *reinterpret_cast<int4*>(&item) = src[0];
    *(reinterpret_cast<int4*>(&item) + 1) = src[1];
  }
  const int kvh = blockIdx.y;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int rw = warp / TOK_WARPS, tw = warp % TOK_WARPS;
  const int g = lane / 4, t = lane % 4;
  const int group = args.num_q_heads / args.num_kv_heads;

  uint8_t* raw = smem;                                                 // [stage][K|V][kTile rows]
  float* tok_scale = reinterpret_cast<float*>(smem + Cfg::kRawBytes);  // [stage][K|V][kTile]

  const int32_t* pages = args.pages + item.page_base;
  const int lbs = args.log2_block_size;  // block sizes are powers of two: shifts, not divisions
  const int bs_mask = (1 << lbs) - 1;
  const size_t page_stride = static_cast<size_t>(args.num_kv_heads) << lbs;  // rows per page

  // Causal: the query token at sequence position p sees keys [0, p].
  const int first_row_pos = item.q_pos0;
  int row_pos[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) row_pos[i] = item.q_pos0 + (rw * 16 + g + 8 * i) / group;

  const int num_tiles = (item.kv_end - item.kv_start + kTile - 1) / kTile;
  constexpr int kRowsPerThread = Cfg::kRowsPerThread;
  constexpr int kSrcRowBytes = D * C::kBytes;
  const int my_chunk = tid % Cfg::kChunksPerRow;
  const int my_row0 = (tid / Cfg::kChunksPerRow) * kRowsPerThread;
  // The next tile's copy: the page id of this thread's first row is loaded two tiles ahead and
  // only used when that tile's copy is issued, so the dependent page-table load hides behind a
  // whole tile of compute. Rows past the chunk end are zero-filled: they must not hold NaNs.
  int next_page = 0, next_j = 0, next_valid = 0;
  const size_t head_base = static_cast<size_t>(kvh) << lbs;
  auto fetch_pages = [&](int tile) {
    next_j = item.kv_start + tile * kTile + my_row0;
    next_valid = tile < num_tiles ? min(max(item.kv_end - next_j, 0), kRowsPerThread) : 0;
    next_page = next_valid > 0 ? pages[next_j >> lbs] : 0;
  };
  auto issue_tile = [&](int stage) {
    // Cache row of this thread's first row. Rows past the end stay inside that page, so their
    // (unread) addresses stay valid.
    const size_t next_row = next_valid > 0 ? static_cast<size_t>(next_page) * page_stride +
                                                 head_base + (next_j & bs_mask)
                                           : 0;
    const size_t src = next_row * kSrcRowBytes + my_chunk * 16;
    const uint8_t* k_src = static_cast<const uint8_t*>(args.k_cache) + src;
    const uint8_t* v_src = static_cast<const uint8_t*>(args.v_cache) + src;
    uint8_t* dst = raw + stage * 2 * Cfg::kTileBytes + my_row0 * Cfg::kRowBytes + my_chunk * 16;
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const bool valid = i < next_valid;
      CpAsync16(dst + i * Cfg::kRowBytes, k_src + i * kSrcRowBytes, valid);
      CpAsync16(dst + Cfg::kTileBytes + i * Cfg::kRowBytes, v_src + i * kSrcRowBytes, valid);
    }
    if constexpr (kPerToken) {
      if (my_chunk == 0) {
        // Per-token scales are indexed like cache rows.
#pragma unroll
        for (int i = 0; i < kRowsPerThread; ++i) {
          const bool valid = i < next_valid;
          float* ds = tok_scale + stage * 2 * kTile + my_row0 + i;
          CpAsync4(ds, args.k_scale + next_row + i, valid);
          CpAsync4(ds + kTile, args.v_scale + next_row + i, valid);
        }
      }
    }
  };

  // Prologue order matters (warps issue in order): the first page id and this warp's q are both
  // requested before anything waits on either, then tile 0's copy, then q is packed.
  fetch_pages(0);
  // Launched early (programmatic dependent launch): the work item and the block table were
  // uploaded before the previous kernel; q, the cache and its scales may be its output.
  ptx::GridDependencyWait();
  uint32_t qraw[kKSteps][4];  // bf16x2 bits of q (0 for padding rows)
  {
    const __nv_bfloat16* q = static_cast<const __nv_bfloat16*>(args.q);
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int r = rw * 16 + g + ((j & 1) ? 8 : 0);
        const int tok = r / group, head = kvh * group + r % group;
        qraw[kk][j] =
            tok < item.q_len
                ? *reinterpret_cast<const uint32_t*>(
                      q + (static_cast<size_t>(item.q_start + tok) * args.num_q_heads + head) * D +
                      F::QCol(kk, t, j))
                : 0u;
      }
    }
  }
  if (num_tiles > 0) issue_tile(0);
  CpAsyncCommit();
  fetch_pages(1);
  // Deeper rings: tiles 1 .. kStages - 2 too. One commit group per tile (empty past the end), so
  // waiting for all but the newest kStages - 1 groups always means "tile t has landed".
#pragma unroll
  for (int st = 1; st < Cfg::kStages - 1; ++st) {
    if (st < num_tiles) issue_tile(st);
    CpAsyncCommit();
    fetch_pages(st + 1);
  }

  // q fragments for this warp's 16 rows (per-channel K scale folded in).
  uint32_t qa[kKSteps][4];
#pragma unroll
  for (int kk = 0; kk < kKSteps; ++kk) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162*>(&qraw[kk][j]);
      float x0 = __bfloat162float(v.x), x1 = __bfloat162float(v.y);
      if (args.scale_mode == static_cast<int>(ScaleMode::kPerChannel)) {
        const int col = F::QCol(kk, t, j);
        x0 *= args.k_scale[kvh * D + col];
        x1 *= args.k_scale[kvh * D + col + 1];
      }
      qa[kk][j] = F::Pack(x0, x1);
    }
  }
  float scale_log2 = args.scale_log2;
  if (args.scale_mode == static_cast<int>(ScaleMode::kPerHead)) scale_log2 *= args.k_scale[kvh];
  const float lazy_raw = kLazyLog2 / scale_log2;  // the lazy-max slack in raw-score units

  float acc[kNTiles][4];
#pragma unroll
  for (int n = 0; n < kNTiles; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY};
  float l_run[2] = {0.f, 0.f};
  float psum[4] = {0.f, 0.f, 0.f, 0.f};  // int8: per-row sums of the fp16 P (Frag::RowSums)

  for (int tile = 0; tile < num_tiles; ++tile) {
    const int stage = tile % Cfg::kStages;
    const int ahead = tile + Cfg::kStages - 1;  // into the stage tile - 1 left
    if (ahead < num_tiles) issue_tile(ahead % Cfg::kStages);
    CpAsyncCommit();
    fetch_pages(ahead + 1);
    CpAsyncWait<Cfg::kStages - 1>();
    RingSync<Cfg>();
    const uint8_t* k_tile = raw + (stage * 2 + 0) * Cfg::kTileBytes;
    const uint8_t* v_tile = raw + (stage * 2 + 1) * Cfg::kTileBytes;
    const float* ks = tok_scale + (stage * 2 + 0) * kTile;
    const float* vs = tok_scale + (stage * 2 + 1) * kTile;
    const int tile_base = item.kv_start + tile * kTile;
    // Masking is only needed where the tile crosses the chunk end or the causal diagonal.
    const bool need_mask = tile_base + kTile > item.kv_end || tile_base + kTile - 1 > first_row_pos;

    constexpr int kStepsPerWarp = kTile / 16 / TOK_WARPS;
    auto step = [&](auto mask_tag, int n0) {
      constexpr bool kMask = decltype(mask_tag)::value;
      float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
      // The +1152 int8 offset shifts a row's scores by a constant, unless per-token scales
      // multiply the columns.
      F::template QK<!kPerToken>(s, qa, k_tile, n0, lane);
      if constexpr (kPerToken) {
#pragma unroll
        for (int n = 0; n < 2; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) s[n][e] *= ks[n0 + n * 8 + 2 * t + (e & 1)];
        }
      }
      uint32_t pa[4];
      // P . diag(v_scale) . V for per-token scales.
      SoftmaxStep<F, kMask, kPerToken>(s, m_run, l_run, acc, psum, pa, scale_log2, lazy_raw,
                                       tile_base + n0, item.kv_end, row_pos, t, vs + n0);
      F::PV(acc, pa, v_tile, n0, lane);
      F::RowSums(psum, pa);
    };
    if (need_mask) {
#pragma unroll
      for (int st = 0; st < kStepsPerWarp; ++st) {
        const int n0 = (tw * kStepsPerWarp + st) * 16;
        if (tile_base + n0 >= item.kv_end) break;
        step(std::true_type{}, n0);
      }
    } else {
#pragma unroll
      for (int st = 0; st < kStepsPerWarp; ++st)
        step(std::false_type{}, (tw * kStepsPerWarp + st) * 16);
    }
    RingSync<Cfg>();  // the next iteration's loads overwrite this stage
  }
  ptx::GridDependencyLaunch();  // the next kernel's prologue may overlap this epilogue

  if constexpr (F::kVOffset) {  // remove the +1152 carried by every int8 V value
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[n][e] -= 1152.f * psum[e & 2];
    }
  }
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {  // each thread summed only its own columns
    l_run[ri] += __shfl_xor_sync(0xffffffff, l_run[ri], 1);
    l_run[ri] += __shfl_xor_sync(0xffffffff, l_run[ri], 2);
  }
  // m_run is in raw-score units; the log2-domain max is m * scale_log2.
  float m_log2[2];
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    m_log2[ri] = m_run[ri] == -INFINITY ? -INFINITY : m_run[ri] * scale_log2;
  }

  // Rows of this tile that hold a query (tokens x group); the rest are padding.
  const int valid_rows = min(item.q_len * group, Cfg::kRows);
  // Writes normalized output elements d0..d0+3 of tile row r, and the row's lse (log2) with d0 0.
  auto emit4 = [&](int r, int d0, float4 v, float lse) {
    const int tok = r / group, head = kvh * group + r % group;
    float o[4] = {v.x, v.y, v.z, v.w};
    if (args.scale_mode == static_cast<int>(ScaleMode::kPerHead)) {
      const float vsc = args.v_scale[kvh];
#pragma unroll
      for (int i = 0; i < 4; ++i) o[i] *= vsc;
    } else if (args.scale_mode == static_cast<int>(ScaleMode::kPerChannel)) {
#pragma unroll
      for (int i = 0; i < 4; ++i) o[i] *= args.v_scale[kvh * D + d0 + i];
    }
    if (item.partial < 0) {
      StoreBf16x4(static_cast<__nv_bfloat16*>(args.out) +
                      (static_cast<size_t>(item.q_start + tok) * args.num_q_heads + head) * D + d0,
                  o);
    } else {
      const size_t prow =
          (static_cast<size_t>(item.partial) * args.num_kv_heads + kvh) * kPartialRows + r;
      *reinterpret_cast<float4*>(args.partial_o + prow * D + d0) =
          make_float4(o[0], o[1], o[2], o[3]);
      if (d0 == 0) args.partial_lse[prow] = lse;
    }
  };

  // Both layouts stage the normalized rows through shared memory (the KV tiles are no longer
  // needed) so the global writes are 16-byte vectors of whole rows.
  float* ms = reinterpret_cast<float*>(smem);  // [warp][16] m (log2)
  float* ls = ms + Cfg::kWarps * 16;           // [warp][16] l
  float* fs = ls + Cfg::kWarps * 16;           // [warp][16] merge factor
  float* as = fs + Cfg::kWarps * 16;           // [warp][16][D]
  if constexpr (TOK_WARPS == 1) {
    static_assert(Cfg::kRows * (D + 1) * 4 <= Cfg::kMainBytes, "output staging fits the KV area");
    float* os = reinterpret_cast<float*>(smem);  // [kRows][D] normalized rows, then lse
    float* lse_s = os + Cfg::kRows * D;
    __syncthreads();
    float inv[2];
#pragma unroll
    for (int ri = 0; ri < 2; ++ri) inv[ri] = l_run[ri] > 0.f ? 1.f / l_run[ri] : 0.f;
    if (t == 0) {
#pragma unroll
      for (int ri = 0; ri < 2; ++ri) {
        lse_s[rw * 16 + g + 8 * ri] = l_run[ri] > 0.f ? m_log2[ri] + __log2f(l_run[ri]) : -INFINITY;
      }
    }
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        int row, d;
        F::AccCoord(n, e, g, t, &row, &d);
        os[(rw * 16 + row) * D + d] = acc[n][e] * inv[e >> 1];
      }
    }
    __syncthreads();
    for (int idx = tid; idx < valid_rows * (D / 4); idx += Cfg::kThreads) {
      const int r = idx / (D / 4), d0 = (idx % (D / 4)) * 4;
      emit4(r, d0, *reinterpret_cast<const float4*>(os + r * D + d0), lse_s[r]);
    }
  } else {
    // Merge the token-split warps: per-row factors once, then a weighted sum of float4s.
    __syncthreads();
    if (t == 0) {
      ms[warp * 16 + g] = m_log2[0];
      ms[warp * 16 + g + 8] = m_log2[1];
      ls[warp * 16 + g] = l_run[0];
      ls[warp * 16 + g + 8] = l_run[1];
    }
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        int row, d;
        F::AccCoord(n, e, g, t, &row, &d);
        as[(warp * 16 + row) * D + d] = acc[n][e];
      }
    }
    __syncthreads();
    if (tid < 16) {
      const int r = tid;
      float m = -INFINITY;
#pragma unroll
      for (int w = 0; w < Cfg::kWarps; ++w) m = fmaxf(m, ms[w * 16 + r]);
      const float m_use = m == -INFINITY ? 0.f : m;
      float l = 0.f;
      float f[Cfg::kWarps];
#pragma unroll
      for (int w = 0; w < Cfg::kWarps; ++w) {
        f[w] = ptx::Exp2Ftz(ms[w * 16 + r] - m_use);
        l += ls[w * 16 + r] * f[w];
      }
      const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
      for (int w = 0; w < Cfg::kWarps; ++w) fs[w * 16 + r] = f[w] * inv;
      ms[r] = l > 0.f ? m_use + __log2f(l) : -INFINITY;  // row lse; warp 0's m is consumed
    }
    __syncthreads();
    for (int idx = tid; idx < valid_rows * (D / 4); idx += Cfg::kThreads) {
      const int r = idx / (D / 4), d0 = (idx % (D / 4)) * 4;
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int w = 0; w < Cfg::kWarps; ++w) {
        const float f = fs[w * 16 + r];
        const float4 a = *reinterpret_cast<const float4*>(as + (w * 16 + r) * D + d0);
        v.x += a.x * f;
        v.y += a.y * f;
        v.z += a.z * f;
        v.w += a.w * f;
      }
      emit4(r, d0, v, ms[r]);
    }
  }

  if (item.partial < 0) return;
  // A split tile: the CTA that finishes the tile's last chunk (for this KV head) merges them.
  // Release/acquire through thread 0 (as CUTLASS's semaphore does): the barrier orders every
  // thread's partial stores before its fence and atomic, and its fence after the atomic orders
  // the merge's loads after the other chunks' counts.
  __shared__ int s_last;
  __syncthreads();  // (also: the staging reads above are done; the merge reuses shared memory)
  const C8MergeItem mi = args.merges[item.merge];
  int* counter = args.merge_counters + static_cast<size_t>(item.merge) * args.num_kv_heads + kvh;
  if (tid == 0) {
    __threadfence();
    s_last = atomicAdd(counter, 1) == mi.num_partials - 1;
    __threadfence();
  }
  __syncthreads();
  if (!s_last) return;
  MergeChunks<D, Cfg::kThreads, Cfg::kRows>(args, mi, kvh, group, valid_rows, smem);
  if (tid == 0) *counter = 0;  // zero again for the next launch (graph replays reuse it)
}

// Raising the dynamic shared-memory limit is a host call: once per kernel instantiation.
template <typename C, int D, int RW, int TW, bool PT, int ST>
void EnsureSmemLimit() {
  static const bool done = [] {
    cudaFuncSetAttribute(C8TileKernel<C, D, RW, TW, PT, ST>,
                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                         TileConfig<C, D, RW, TW, ST>::kSmemBytes);
    return true;
  }();
  (void)done;
}

constexpr int kPrefillRowWarps = 8;  // 128-row prefill tiles
constexpr int kDecodeTokWarps = 4;   // 16-row decode tiles, KV split over 4 warps

// The decode layout's cp.async ring depth for a request (0: the cache type's preferred depth;
// else 2..kMaxDecodeStages), lowered to the deepest ring the current device lets one block hold.
template <typename C, int D>
int DecodeStages(int requested) {
  int st = requested > 0 ? std::min(requested, kMaxDecodeStages) : C::kDecodeStages;
  auto smem = [](int n) {
    return n >= 4   ? TileConfig<C, D, 1, kDecodeTokWarps, 4>::kSmemBytes
           : n == 3 ? TileConfig<C, D, 1, kDecodeTokWarps, 3>::kSmemBytes
                    : TileConfig<C, D, 1, kDecodeTokWarps, 2>::kSmemBytes;
  };
  while (st > 2 && CurrentDeviceMaxSmemPerBlock() < smem(st)) --st;
  return std::max(st, 2);
}

template <typename C, int D, int RW, int TW, bool PT, int ST>
void LaunchTileKernel(const TileArgs& a, cudaStream_t s) {
  using Cfg = TileConfig<C, D, RW, TW, ST>;
  EnsureSmemLimit<C, D, RW, TW, PT, ST>();
  // The CTAs may start (item, block table, first page ids) while the previous kernel finishes;
  // they wait for it before reading q or the cache.
  (void)LaunchPdl(C8TileKernel<C, D, RW, TW, PT, ST>, dim3(a.num_items, a.num_kv_heads),
                  dim3(Cfg::kThreads), Cfg::kSmemBytes, s, a);
}

template <typename C, int D, bool PT>
void LaunchTilesImpl(const TileArgs& a, bool prefill, cudaStream_t s) {
  if (prefill) {
    LaunchTileKernel<C, D, kPrefillRowWarps, 1, PT, 2>(a, s);
    return;
  }
  switch (DecodeStages<C, D>(a.decode_stages)) {
    case 4:
      LaunchTileKernel<C, D, 1, kDecodeTokWarps, PT, 4>(a, s);
      break;
    case 3:
      LaunchTileKernel<C, D, 1, kDecodeTokWarps, PT, 3>(a, s);
      break;
    default:
      LaunchTileKernel<C, D, 1, kDecodeTokWarps, PT, 2>(a, s);
  }
}

template <typename C, int D>
void LaunchTilesImpl(const TileArgs& a, bool prefill, void* stream) {
  if (a.num_items == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  // Per-token scales exist only for 8-bit caches.
  if constexpr (C::kBytes == 1) {
    if (a.scale_mode == static_cast<int>(ScaleMode::kPerToken)) {
      LaunchTilesImpl<C, D, true>(a, prefill, s);
      return;
    }
  }
  LaunchTilesImpl<C, D, false>(a, prefill, s);
}

template <typename C, int D, int ST>
int DecodeCtasPerSmImpl() {
  using Cfg = TileConfig<C, D, 1, kDecodeTokWarps, ST>;
  EnsureSmemLimit<C, D, 1, kDecodeTokWarps, false, ST>();
  int n = 0;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &n, C8TileKernel<C, D, 1, kDecodeTokWarps, false, ST>, Cfg::kThreads, Cfg::kSmemBytes);
  return n;
}

template <typename C, int D>
int DecodeCtasPerSmImpl(int stages) {
  const int st = DecodeStages<C, D>(stages);
  if (stages > 0 && st != stages) return 0;  // that ring does not fit a block here
  switch (st) {
    case 4:
      return DecodeCtasPerSmImpl<C, D, 4>();
    case 3:
      return DecodeCtasPerSmImpl<C, D, 3>();
    default:
      return DecodeCtasPerSmImpl<C, D, 2>();
  }
}

template <typename C>
int DecodeCtasPerSm(int head_dim, int stages) {
  return head_dim == 64 ? DecodeCtasPerSmImpl<C, 64>(stages) : DecodeCtasPerSmImpl<C, 128>(stages);
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
