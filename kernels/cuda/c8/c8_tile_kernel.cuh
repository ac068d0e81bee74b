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
// lazily (only when a query's max grows by 2^8), so most steps skip the accumulator rescale. Two
// warp layouts, each with its own math:
// - decode (1 row group x 4 token groups): the four warps split each KV tile and merge at the
//   end; each warp copies only its own token slice, so its ring syncs per warp. KV tokens are the
//   MMA's M dimension and the tile's few query rows its N (ColMath, c8_col_math.cuh).
// - prefill (8 row groups x 1): each warp owns 16 query rows as the MMA's M, all warps share a
//   tile behind CTA barriers (RowMath, c8_row_math.cuh).
// Outputs are staged in shared memory and written as 16-byte rows. Scales: per-head K scale
// folds into the softmax scale; per-channel K scale folds into q; V scales (per head / channel)
// multiply the output; per-token (dynamic) scales multiply score columns (K) and probabilities
// (V), in a separate instantiation.
// Sliding windows and sink logits (gpt-oss, Mistral, Qwen2): a CTA starts its KV loop at the block
// holding its first query's window start (blocks left of it may be freed, -1 in the table) and
// masks per key only in tiles that cross a window's left edge, as at the causal diagonal; a sink
// adds one term to the softmax denominator, once per query row: in the epilogue of an unsplit
// tile, or in the merge of a split one (a partial's lse covers its keys only). Neither adds work
// to a layer without them beyond a compare per tile.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/c8/c8_col_math.cuh"
#include "kernels/cuda/c8/c8_kernel_args.h"
#include "kernels/cuda/c8/c8_row_math.cuh"
#include "kernels/cuda/common/device_info.h"
#include "kernels/cuda/common/pdl_launch.cuh"
#include "kernels/cuda/common/ptx_ops.cuh"
#include "kernels/cuda/ops/fp8_rows.cuh"

namespace llm::cuda::detail {

using ptx::CpAsync16;
using ptx::CpAsync4;
using ptx::CpAsyncCommit;
using ptx::CpAsyncWait;
using ptx::StoreBf16x4;

template <typename C, int D, int ROW_WARPS, int TOK_WARPS, int STAGES = 2>
struct TileConfig {
  static constexpr int kWarps = ROW_WARPS * TOK_WARPS;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRows = 16 * ROW_WARPS;
  static constexpr int kTile = C::kTile;
  static constexpr int kRowBytes = CacheFrag<C, D>::kRowBytes;
  static constexpr int kTileBytes = kTile * kRowBytes;        // one of K or V, one stage
  static constexpr int kStages = STAGES;                      // cp.async ring depth
  static constexpr int kRawBytes = kStages * 2 * kTileBytes;  // stages x (K, V)
  static constexpr int kScaleBytes = kStages * 2 * kTile * 4;
  // Token-split merge: [warp][16] m, [warp][16] l, [warp][16] factors, [warp][16][D] acc.
  // Single token group: the normalized rows and their lse, [kRows][D + 1].
  static constexpr int kMergeBytes = TOK_WARPS > 1 ? kWarps*(16 * D + 48) * 4
                                                   : 16 * ROW_WARPS*(D + 1) * 4;
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
  // warps drift apart instead of meeting at a CTA barrier twice per tile. That paid on the 2- and
  // 3-stage rings of full batches but not on the 4-stage ring of tiny split grids (measured:
  // docs/log/PERFORMANCE_NOTEBOOK.md), so that ring keeps the CTA barrier.
  static constexpr bool kWarpPrivateRows = ROW_WARPS == 1 && STAGES <= 3;
  static_assert(!kWarpPrivateRows || (32 % kChunksPerRow == 0 &&
                                      (32 / kChunksPerRow) * kRowsPerThread == kTile / TOK_WARPS),
                "each warp's copies cover exactly the rows it reads");
};

// Output elements [elem, elem + 4) of the flattened [T, Hq, D] output: bf16, or the e4m3 bytes of
// o * out_inv_scale when the caller asked for o_proj's fp8 input (TileArgs::out_fp8).
__device__ __forceinline__ void StoreOut4(const TileArgs& args, size_t elem, const float (&o)[4]) {
  if (args.out_fp8 != nullptr) {
    *reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(args.out_fp8) + elem) =
        PackFp8x4Fast(o, args.out_inv_scale);
  } else {
    StoreBf16x4(static_cast<__nv_bfloat16*>(args.out) + elem, o);
  }
}

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

constexpr float kLog2e = 1.4426950408889634f;

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
    // The sink logit (log2 domain) is one more term of the denominator, with a zero value.
    float sink = -INFINITY;
    if (args.sink_logits != nullptr) {
      sink = args.sink_logits[kvh * group + r % group] * kLog2e;
      m = fmaxf(m, sink);
    }
    const float m_use = m == -INFINITY ? 0.f : m;
    float sum = args.sink_logits != nullptr ? ptx::Exp2Ftz(sink - m_use) : 0.f;
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
    StoreOut4(args, (static_cast<size_t>(mi.q_start + tok) * args.num_q_heads + head) * D + d0, o);
  }
}

// An unsplit tile's output row with a sink (natural-log logit): acc / (l + e^sink) =
// (acc / l) / (1 + 2^(sink log2 - lse)), lse the row's log2 sum over its keys. A split tile's merge
// adds the sink instead (MergeChunks).
__device__ __forceinline__ float SinkFactor(float sink, float lse) {
  return 1.f / (1.f + ptx::Exp2Ftz(sink * kLog2e - lse));
}

// int8 K keeps its +1152 offset in the scores unless per-token scales multiply them
// (Bytes2ToF16x2): a row's raw scores are q.k + 1152 sum(q), with q as the MMA saw it (fp16, the
// per-channel K scale folded in). The softmax ignores that constant but a sink logit, compared
// with absolute scores, does not: this is the offset of tile row r in the log2 domain of its lse.
template <int D>
__device__ float Int8ScoreOffsetLog2(const TileArgs& args, const C8WorkItem& item, int kvh,
                                     int group, int r, float scale_log2) {
  const int tok = r / group, head = kvh * group + r % group;
  if (tok >= item.q_len) return 0.f;  // padding row
  const __nv_bfloat16* q = static_cast<const __nv_bfloat16*>(args.q) +
                           (static_cast<size_t>(item.q_start + tok) * args.num_q_heads + head) * D;
  const bool per_channel = args.scale_mode == static_cast<int>(ScaleMode::kPerChannel);
  float sum = 0.f;
  for (int d = 0; d < D; ++d) {
    float x = __bfloat162float(q[d]);
    if (per_channel) x *= args.k_scale[kvh * D + d];
    sum += __half2float(__float2half_rn(x));
  }
  return 1152.f * sum * scale_log2;
}

// The math of a layout: the decode layout (one row group) puts KV tokens in the MMA's M and its
// query rows (at most 8 x NT) in N; prefill puts 16 query rows per warp in M.
template <typename C, int D, int ROW_WARPS, bool kPerToken, int NT>
using TileMath =
    std::conditional_t<ROW_WARPS == 1, ColMath<C, D, NT, kPerToken>, RowMath<C, D, kPerToken>>;

// Decode CTAs with two n-tiles are capped at 168 registers so three fit an SM, as the 2-stage
// 8-bit ring's shared memory allows (uncapped they take about 170; one n-tile takes about 100).
template <typename C, int D, int ROW_WARPS, int TOK_WARPS, bool kPerToken, int STAGES, int NT>
__global__ void __launch_bounds__(ROW_WARPS* TOK_WARPS * 32, ROW_WARPS == 1 && NT == 2 ? 3 : 1)
    C8TileKernel(const TileArgs args) {
  using Cfg = TileConfig<C, D, ROW_WARPS, TOK_WARPS, STAGES>;
  using Math = TileMath<C, D, ROW_WARPS, kPerToken, NT>;
  constexpr int kTile = Cfg::kTile;
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
  const int group = args.num_q_heads / args.num_kv_heads;
  const int row0 = rw * Math::kWarpRows;  // this warp's first query row

  uint8_t* raw = smem;                                                 // [stage][K|V][kTile rows]
  float* tok_scale = reinterpret_cast<float*>(smem + Cfg::kRawBytes);  // [stage][K|V][kTile]

  const int32_t* pages = args.pages + item.page_base;
  const int lbs = args.log2_block_size;  // block sizes are powers of two: shifts, not divisions
  const int bs_mask = (1 << lbs) - 1;
  const size_t page_stride = static_cast<size_t>(args.num_kv_heads) << lbs;  // rows per page

  // Causal: the query token at sequence position p sees keys [0, p], or [p - window, p]. With a
  // window the loop starts at the block holding the first query's window start (the planner's
  // chunks do not know the layer's window): the blocks before it may be freed (-1). A split
  // chunk wholly left of it is left empty (no tiles; its partial has lse -inf).
  item.kv_start = C8WindowedKvStart(item.kv_start, item.kv_end, item.q_pos0, args.window, bs_mask);
  // Tiles crossing the chunk end, the first query's diagonal or the last query's window start
  // are masked per key (c8_window.h).
  const C8UnmaskedTiles unmasked =
      C8UnmaskedTileStarts(item.q_pos0, item.q_len, item.kv_end, args.window, kTile);

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
  Math math;
  math.LoadQ(args, item, kvh, group, row0, lane);
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

  float scale_log2 = args.scale_log2;
  if (args.scale_mode == static_cast<int>(ScaleMode::kPerHead)) scale_log2 *= args.k_scale[kvh];
  math.Init(args, item, kvh, group, row0, lane, scale_log2);

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
    // Masking is only needed where the tile crosses the chunk end, the causal diagonal or a
    // window's left edge.
    const bool need_mask = C8TileNeedsMask(tile_base, unmasked);

    constexpr int kStepsPerWarp = kTile / 16 / TOK_WARPS;
    auto step = [&](auto mask_tag, int n0) {
      math.template Step<decltype(mask_tag)::value>(k_tile, v_tile, ks, vs, n0, tile_base + n0,
                                                    item.kv_end, args.window, lane);
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

  math.Finish();

  // The lse of a row whose scores carry int8 K's offset is shifted by it; only a sink needs the
  // absolute value (the merge of split chunks sees the same shift in all of them).
  constexpr bool kOffsetScores = std::is_same_v<C, Int8Cache> && !kPerToken;
  // Rows of this tile that hold a query (tokens x group); the rest are padding.
  const int valid_rows = min(item.q_len * group, Cfg::kRows);
  // Writes normalized output elements d0..d0+3 of tile row r, and the row's lse (log2) with d0 0.
  auto emit4 = [&](int r, int d0, float4 v, float lse) {
    const int tok = r / group, head = kvh * group + r % group;
    float o[4] = {v.x, v.y, v.z, v.w};
    // The decode layout folds the sink into its warp-merge factors instead (fewer registers).
    if (TOK_WARPS == 1 && args.sink_logits != nullptr && item.partial < 0) {
      const float f = SinkFactor(args.sink_logits[head], lse);
#pragma unroll
      for (int i = 0; i < 4; ++i) o[i] *= f;
    }
    if (args.scale_mode == static_cast<int>(ScaleMode::kPerHead)) {
      const float vsc = args.v_scale[kvh];
#pragma unroll
      for (int i = 0; i < 4; ++i) o[i] *= vsc;
    } else if (args.scale_mode == static_cast<int>(ScaleMode::kPerChannel)) {
#pragma unroll
      for (int i = 0; i < 4; ++i) o[i] *= args.v_scale[kvh * D + d0 + i];
    }
    if (item.partial < 0) {
      StoreOut4(args, (static_cast<size_t>(item.q_start + tok) * args.num_q_heads + head) * D + d0,
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
    float* os = reinterpret_cast<float*>(smem);  // [kRows][D] normalized rows, then lse
    float* lse_s = os + Cfg::kRows * D;
    __syncthreads();
    float inv[Math::kSlots];
#pragma unroll
    for (int i = 0; i < Math::kSlots; ++i) inv[i] = math.l_run[i] > 0.f ? 1.f / math.l_run[i] : 0.f;
    math.ForEachRowStat(lane, [&](int row, int i) {
      float lse = math.l_run[i] > 0.f ? math.m_log2[i] + __log2f(math.l_run[i]) : -INFINITY;
      if constexpr (kOffsetScores) {
        if (args.sink_logits != nullptr) {
          lse -= Int8ScoreOffsetLog2<D>(args, item, kvh, group, row0 + row, scale_log2);
        }
      }
      lse_s[row0 + row] = lse;
    });
    math.ForEachOut(lane,
                    [&](int row, int d, float v, int i) { os[(row0 + row) * D + d] = v * inv[i]; });
    __syncthreads();
    for (int idx = tid; idx < valid_rows * (D / 4); idx += Cfg::kThreads) {
      const int r = idx / (D / 4), d0 = (idx % (D / 4)) * 4;
      emit4(r, d0, *reinterpret_cast<const float4*>(os + r * D + d0), lse_s[r]);
    }
  } else {
    // Merge the token-split warps: per-row factors once, then a weighted sum of float4s. Rows
    // past the math's kWarpRows hold no query (the launch picks NT to cover the tile's rows).
    static_assert(Math::kWarpRows <= 16, "merge staging holds 16 rows per warp");
    __syncthreads();
    math.ForEachRowStat(lane, [&](int row, int i) {
      ms[warp * 16 + row] = math.m_log2[i];
      ls[warp * 16 + row] = math.l_run[i];
    });
    math.ForEachOut(lane, [&](int row, int d, float v, int) { as[(warp * 16 + row) * D + d] = v; });
    __syncthreads();
    if (tid < Math::kWarpRows) {
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
      float inv = l > 0.f ? 1.f / l : 0.f;
      float lse = l > 0.f ? m_use + __log2f(l) : -INFINITY;
      if constexpr (kOffsetScores) {
        if (args.sink_logits != nullptr) {
          lse -= Int8ScoreOffsetLog2<D>(args, item, kvh, group, r, scale_log2);
        }
      }
      if (args.sink_logits != nullptr && item.partial < 0) {
        inv *= SinkFactor(args.sink_logits[kvh * group + r % group], lse);
      }
#pragma unroll
      for (int w = 0; w < Cfg::kWarps; ++w) fs[w * 16 + r] = f[w] * inv;
      ms[r] = lse;  // row lse; warp 0's m is consumed
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
template <typename C, int D, int RW, int TW, bool PT, int ST, int NT>
void EnsureSmemLimit() {
  static const bool done = [] {
    cudaFuncSetAttribute(C8TileKernel<C, D, RW, TW, PT, ST, NT>,
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

template <typename C, int D, int RW, int TW, bool PT, int ST, int NT = 1>
void LaunchTileKernel(const TileArgs& a, cudaStream_t s) {
  using Cfg = TileConfig<C, D, RW, TW, ST>;
  EnsureSmemLimit<C, D, RW, TW, PT, ST, NT>();
  // The CTAs may start (item, block table, first page ids) while the previous kernel finishes;
  // they wait for it before reading q or the cache.
  (void)LaunchPdl(C8TileKernel<C, D, RW, TW, PT, ST, NT>, dim3(a.num_items, a.num_kv_heads),
                  dim3(Cfg::kThreads), Cfg::kSmemBytes, s, a);
}

// Decode: one n-tile of query rows when every tile has at most 8 (a GQA group of up to 8 with one
// query token), else two.
template <typename C, int D, bool PT, int ST>
void LaunchDecodeTiles(const TileArgs& a, cudaStream_t s) {
  if (a.decode_rows > 0 && a.decode_rows <= 8) {
    LaunchTileKernel<C, D, 1, kDecodeTokWarps, PT, ST, 1>(a, s);
  } else {
    LaunchTileKernel<C, D, 1, kDecodeTokWarps, PT, ST, 2>(a, s);
  }
}

template <typename C, int D, bool PT>
void LaunchTilesImpl(const TileArgs& a, bool prefill, cudaStream_t s) {
  if (prefill) {
    LaunchTileKernel<C, D, kPrefillRowWarps, 1, PT, 2>(a, s);
    return;
  }
  switch (DecodeStages<C, D>(a.decode_stages)) {
    case 4:
      LaunchDecodeTiles<C, D, PT, 4>(a, s);
      break;
    case 3:
      LaunchDecodeTiles<C, D, PT, 3>(a, s);
      break;
    default:
      LaunchDecodeTiles<C, D, PT, 2>(a, s);
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
  // Both n-tile variants: the planner counts on the smaller occupancy.
  int n[2] = {0, 0};
  EnsureSmemLimit<C, D, 1, kDecodeTokWarps, false, ST, 1>();
  EnsureSmemLimit<C, D, 1, kDecodeTokWarps, false, ST, 2>();
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &n[0], C8TileKernel<C, D, 1, kDecodeTokWarps, false, ST, 1>, Cfg::kThreads, Cfg::kSmemBytes);
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &n[1], C8TileKernel<C, D, 1, kDecodeTokWarps, false, ST, 2>, Cfg::kThreads, Cfg::kSmemBytes);
  return std::min(n[0], n[1]);
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
