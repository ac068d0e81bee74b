// Paged-KV flash attention forward (CK tile fmha_fwd_pagedkv design), one source for CUDA and
// HIP: the kernel uses only kernels/gpu_port.h (warp tile MMA, copies, shuffles) and contains no
// platform #if. Included by one .cu per element type (fmha_fwd_bf16.cu, fmha_fwd_fp16.cu).
//
// Work split: one CTA = one tile of packed rows of one (sequence, KV head), optionally one KV
// split; grid (kv_heads x splits, row tiles, batch), row tiles in reverse so the heaviest causal
// tiles start first. Rows pack the GQA group: packed row R of a sequence is query token
// R / group, query head kv_head * group + R % group, so each K/V byte loaded serves the whole
// group (decode shapes fill the 16-row MMA tile with heads instead of padding).
// Per CTA: Q tile -> shared memory once; KV tiles of kN keys stream through shared memory
// (two-stage cp.async ring on CUDA, single stage with plain loads on HIP), gathered through the
// block table (paged; block ids looked up a tile or two ahead, see kPrefetchRows / kIdsInSmem)
// or from the cache row (contiguous); S = Q K^T and O += P V on the warp tile MMA; scale /
// soft-cap / ALiBi / mask in registers; online softmax in the log2 domain (log2 e and, without
// soft-cap / ALiBi, the softmax scale folded into the exponent's FMA).
// The CTA's tile list is the sink tiles plus the tiles covering the union of its rows' visible
// windows (row windows [lo, hi] are monotone in the query index, so the first and last rows bound
// them): tiles no row can see are never visited, keys no row of the CTA can see are zero-filled
// instead of read (their blocks may hold anything, or be unmapped), and tiles every row sees
// completely skip the mask arithmetic.
// Two warp layouts (Cfg): prefill (4 row warps x 32 rows, each warp reuses each K/V fragment
// for two 16-row MMA tiles, Q re-read from shared memory; 16 rows per warp at head_dim 256) and
// decode (16 rows, Q in registers below head_dim 256, the token warps split each KV tile and
// merge through shared memory at the end).
// Split-KV (num_splits > 1): the CTA's tile list is cut into contiguous pieces; each piece writes
// its normalized partial output and log2-sum-exp, and FmhaMergeKernel combines them (adding the
// learned sink logit once).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/fmha/fmha_dispatch.h"
#include "kernels/fmha/fmha_params.h"
#include "kernels/gpu_port.h"

namespace llm::fmha {

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

// Device copy of the parameters plus the plan.
struct KernelArgs {
  const uint16_t* q;
  uint16_t* out;
  uint8_t* out_fp8;  // set: e4m3 output (FmhaParams::out_fp8) instead of out
  float out_inv_scale;
  float* lse;
  const uint16_t* k;
  const uint16_t* v;
  const int32_t* seqstart_q;
  const int32_t* seqlen_k;
  const int32_t* block_table;
  const int32_t* cache_batch_idx;
  const int32_t* seqstart_k;  // packed KV (contiguous only)
  const float* alibi_slopes;
  const float* sink_logits;
  float* partial_o;
  float* partial_lse;
  int seqlen_q;
  int num_q_heads;
  int num_kv_heads;
  int group;
  int block_size;   // 0: contiguous
  int block_shift;  // log2(block_size) when it is a power of two, else -1
  int max_blocks_per_seq;
  int cache_seqlen;
  int mask_type;
  int window_left;
  int window_right;
  int sink_tokens;
  float scale_log2;   // softmax_scale * log2(e), without soft-cap
  float softcap_in;   // softmax_scale / softcap
  float softcap_out;  // softcap * log2(e)
  int has_softcap;
  int row_tiles;
  int num_splits;
};

template <typename T, int D, int kRowWarps, int kTokWarps, int kMTiles, int kN, int kStages>
struct Cfg {
  using Elem = T;
  static constexpr int kHeadDim = D;
  static constexpr int kRowW = kRowWarps;
  static constexpr int kTokW = kTokWarps;
  static constexpr int kMT = kMTiles;
  static constexpr int kTileN = kN;
  static constexpr int kNumStages = kStages;
  static constexpr int kWarps = kRowWarps * kTokWarps;
  static constexpr int kThreads = kWarps * gpu::kWarpSize;
  static constexpr int kRows = 16 * kMTiles * kRowWarps;
  static constexpr int kLd = D + 8;  // row pitch in elements: 16-byte pad, conflict-free ldmatrix
  static constexpr int kQBytes = kRows * kLd * 2;
  static constexpr int kTileBytes = kN * kLd * 2;  // one K or V tile
  static constexpr int kKvBytes = kStages * 2 * kTileBytes;
  static constexpr int kIdsPerTile = kN / 16 + 1;  // blocks a tile can touch (block_size >= 16)
  static constexpr int kIdBytes = 3 * 8 * 4;       // ring of 3 tiles' block ids, 8 slots each
  static constexpr int kMainBytes = kQBytes + kKvBytes + kIdBytes;
  static constexpr int kMergeBytes = kTokWarps > 1 ? kWarps * 16 * (D + 2) * 4 : 0;
  static constexpr int kSmemBytes = kMainBytes > kMergeBytes ? kMainBytes : kMergeBytes;
  static constexpr int kNPerWarp = kN / kTokWarps;
  // Keys per compute step of a warp (registers for S scale with it; the online softmax runs once
  // per step), and 16-key MMA chunks per step.
  static constexpr int kStepN = kNPerWarp < 32 ? kNPerWarp : 32;
  static constexpr int kSteps = kNPerWarp / kStepN;
  static constexpr int kChunks = kStepN / 16;
  // Decode-like: the warps split each KV tile (token warps). Q in registers only there and at
  // head_dim <= 128 (at 256 its 64 registers beside the 128-register accumulator would spill).
  static constexpr bool kSplitKeys = kTokWarps > 1;
  static constexpr bool kQInRegs = kSplitKeys && D <= 128;
  // Unroll of the QK^T k-loop: full when q fragments live in registers (indexed by k), else two
  // steps, which keeps ptxas from hoisting every fragment load of the 128-row tile (spills).
  static constexpr int kQKUnroll = kQInRegs ? D / 16 : 2;
  // Block-table latency off the copy path. Decode: each thread looks its rows' blocks up one tile
  // ahead into registers. Prefill (no registers to spare): the block ids of the tile two ahead
  // are copied into a shared-memory ring by cp.async, in the same group as the next KV tile.
  static constexpr bool kPrefetchRows = kSplitKeys;
  static constexpr bool kIdsInSmem = !kPrefetchRows && kStages == 2;
  static_assert(kIdsPerTile <= 8, "block id ring slots");
  // Resident CTAs per SM the register allocation must allow: decode is memory-bound and wants
  // three (shared memory allows three at head_dim 128); prefill gets the full register file.
  static constexpr int kMinBlocks = kSplitKeys ? 3 : 1;
  static constexpr int kCopyChunks = D / 8;  // 16-byte chunks per row
  static constexpr int kRowsPerPass = kThreads / kCopyChunks;
  static constexpr int kPasses = kN / kRowsPerPass;
  static_assert(kNPerWarp % kStepN == 0 && kStepN % 16 == 0, "each warp needs whole steps");
  static_assert(kThreads % kCopyChunks == 0 && kN % kRowsPerPass == 0, "copy mapping");
  static_assert(kStages == 1 || kStages == 2, "one or two stages");
};

// The visible key range of one query row: key j is visible iff j <= hi && (j >= lo || j < sink).
struct RowWindow {
  int lo, hi;
};

// tanh through one exp2 and one division: absolute error ~1e-7, so the soft-capped logit is off
// by ~softcap * 1e-7 (tanhf's slow-path temporaries made the unrolled score pass spill).
__device__ __forceinline__ float Tanh(float x) {
  const float e = exp2f(-2.0f * kLog2e * fabsf(x));  // e^(-2|x|) in (0, 1]
  return copysignf((1.0f - e) / (1.0f + e), x);
}

// The key query row i sits on (fmha_params.h): top-left only for kCausalTopLeft.
__device__ __forceinline__ int DiagonalKey(const KernelArgs& a, int i, int sq, int sk) {
  return static_cast<FmhaMaskType>(a.mask_type) == FmhaMaskType::kCausalTopLeft ? i : i + sk - sq;
}

__device__ __forceinline__ RowWindow MakeWindow(const KernelArgs& a, int i, int sq, int sk) {
  const auto type = static_cast<FmhaMaskType>(a.mask_type);
  RowWindow w;
  const int diag = DiagonalKey(a, i, sq, sk);
  w.lo = 0;
  w.hi = sk - 1;
  if (type == FmhaMaskType::kCausalTopLeft || type == FmhaMaskType::kCausalBottomRight) {
    w.hi = min(diag, sk - 1);
  } else if (type == FmhaMaskType::kWindow) {
    if (a.window_left >= 0) w.lo = max(diag - a.window_left, 0);
    if (a.window_right >= 0) w.hi = min(diag + a.window_right, sk - 1);
  }
  return w;
}

// The KV tiles (kN keys each) one CTA visits: the sink tiles, then the tiles covering the union of
// its rows' windows, cut into num_splits contiguous pieces. Row windows [lo, hi] are
// non-decreasing in the query index, so the first and last query tokens of the CTA bound them.
struct TileList {
  int max_hi, min_hi, min_lo, max_lo;  // bounds of the rows' windows
  int sink_end;                        // keys < sink_end are sink keys some row can see
  int n_sink_tiles, main_first;
  int v_begin, v_end;  // this split's range of list positions
  __device__ __forceinline__ int TileOf(int v) const {
    return v < n_sink_tiles ? v : main_first + (v - n_sink_tiles);
  }
  // Whether some row of the CTA can see key j (others are zero-filled instead of read).
  __device__ __forceinline__ bool Needed(int j) const {
    return j <= max_hi && (j >= min_lo || j < sink_end);
  }
  // Whether some row sees only part of the tile starting at key t0 (then the mask runs).
  __device__ __forceinline__ bool NeedsMask(int t0, int kN, int sink_tokens) const {
    const int t1 = t0 + kN - 1;
    return !((t0 >= max_lo && t1 <= min_hi) || (t1 < sink_tokens && t1 <= min_hi));
  }
};

__device__ __forceinline__ TileList MakeTileList(const KernelArgs& a, int tok_first, int tok_last,
                                                 int sq, int sk, int kN, int split) {
  const RowWindow w_first = MakeWindow(a, tok_first, sq, sk);
  const RowWindow w_last = MakeWindow(a, tok_last, sq, sk);
  TileList t;
  t.max_hi = w_last.hi;
  t.min_hi = w_first.hi;
  t.min_lo = w_first.lo;
  t.max_lo = w_last.lo;
  t.sink_end = min(a.sink_tokens, t.max_hi + 1);
  t.n_sink_tiles = t.sink_end > 0 ? (t.sink_end + kN - 1) / kN : 0;
  t.main_first = max(t.min_lo / kN, t.n_sink_tiles);
  const int main_last = t.max_hi >= 0 ? t.max_hi / kN : -1;
  const int total = t.n_sink_tiles + max(0, main_last - t.main_first + 1);
  const int per_split = (total + a.num_splits - 1) / a.num_splits;
  t.v_begin = min(total, split * per_split);
  t.v_end = min(total, t.v_begin + per_split);
  return t;
}

// What one CTA of a forward kernel works on. Grid: (kv_heads x splits, row tiles, batch), row
// tiles in reverse so the heaviest causal tiles start first. `past_end`: the tile lies past this
// sequence's rows (group mode sizes the grid by max_seqlen_q); the CTA has nothing to do.
struct CtaWork {
  int kvh, split, tile, b;
  int q_begin, sq, sk;  // first query row of the sequence, its query rows, its keys
  int row0;             // first packed row of the tile
  bool past_end;
  TileList tl;
};

__device__ __forceinline__ CtaWork MakeCtaWork(const KernelArgs& a, int rows, int kN) {
  CtaWork w;
  w.kvh = blockIdx.x / a.num_splits;
  w.split = blockIdx.x % a.num_splits;
  w.tile = a.row_tiles - 1 - blockIdx.y;
  w.b = blockIdx.z;
  w.q_begin = a.seqstart_q ? a.seqstart_q[w.b] : w.b * a.seqlen_q;
  w.sq = a.seqstart_q ? a.seqstart_q[w.b + 1] - w.q_begin : a.seqlen_q;
  w.sk = a.seqlen_k[w.b];
  w.row0 = w.tile * rows;
  w.past_end = w.row0 >= w.sq * a.group;
  if (!w.past_end) {
    const int tok_first = w.row0 / a.group;
    const int tok_last = min(w.row0 + rows - 1, w.sq * a.group - 1) / a.group;
    w.tl = MakeTileList(a, tok_first, tok_last, w.sq, w.sk, kN, w.split);
  }
  return w;
}

// Element offset of packed row rr's query vector (token rr / group, query head
// kvh * group + rr % group, head_dim D); 0 with valid = false past the sequence's rows.
template <int D>
__device__ __forceinline__ size_t QueryRowOffset(const KernelArgs& a, const CtaWork& w, int rr,
                                                 bool* valid) {
  const int tok = rr / a.group;
  *valid = tok < w.sq;
  return *valid ? (static_cast<size_t>(w.q_begin + tok) * a.num_q_heads + w.kvh * a.group +
                   rr % a.group) *
                      D
                : 0;
}

// KV row (element offset / head_dim) of key j of KV head kvh: paged through block id `blk`, or
// contiguous from the sequence's first key row `key_base` (ContiguousKeyBase).
__device__ __forceinline__ int64_t PagedKvRow(const KernelArgs& a, int blk, int kvh, int j) {
  return (static_cast<int64_t>(blk) * a.num_kv_heads + kvh) * a.block_size + j % a.block_size;
}
__device__ __forceinline__ int64_t ContiguousKvRow(const KernelArgs& a, int64_t key_base, int kvh,
                                                   int j) {
  return (key_base + j) * a.num_kv_heads + kvh;
}
// Key row of sequence b's key 0 without a block table: packed (seqstart_k) or in its cache row.
__device__ __forceinline__ int64_t ContiguousKeyBase(const KernelArgs& a, int b) {
  if (a.seqstart_k) return a.seqstart_k[b];
  const int cache_row = a.cache_batch_idx ? a.cache_batch_idx[b] : b;
  return static_cast<int64_t>(cache_row) * a.cache_seqlen;
}

// Two adjacent output columns (d even) of output row orow: bf16/fp16, or e4m3 bytes.
template <typename T, int D>
__device__ __forceinline__ void StoreOut(const KernelArgs& a, size_t orow, int d, float v0,
                                         float v1) {
  if (a.out_fp8) {
    *reinterpret_cast<uint16_t*>(a.out_fp8 + orow * D + d) =
        gpu::PackE4m3x2(v0 * a.out_inv_scale, v1 * a.out_inv_scale);
  } else {
    *reinterpret_cast<uint32_t*>(a.out + orow * D + d) = T::Pack(v0, v1);
  }
}

// Normalizes and stores the rows of one CTA tile (kRows packed rows starting at row0): the final
// output and lse, or with split-KV the partial output and its log2-sum-exp.
template <typename T, int D, int kRows>
struct OutputWriter {
  const KernelArgs& a;
  int kvh, row0, q_begin, sq;
  size_t part;  // partial slot of (sequence, KV head, row tile, split)
  __device__ OutputWriter(const KernelArgs& args, int b, int kvh_, int tile, int split, int row0_,
                          int q_begin_, int sq_)
      : a(args), kvh(kvh_), row0(row0_), q_begin(q_begin_), sq(sq_) {
    part = ((static_cast<size_t>(b) * a.num_kv_heads + kvh) * a.row_tiles + tile) * a.num_splits +
           split;
  }
  // Final scale of a row's accumulator (m: running max in log2 units, l: sum of 2^(s - m)) and its
  // lse (natural log, or log2 for split partials).
  __device__ void Finalize(int r, float m, float l, float* factor, float* lse) const {
    if (a.num_splits > 1) {
      *factor = l > 0.f ? 1.f / l : 0.f;
      *lse = l > 0.f ? m + log2f(l) : -INFINITY;
      return;
    }
    const int rr = row0 + r;
    const float sink =
        a.sink_logits ? a.sink_logits[kvh * a.group + rr % a.group] * kLog2e : -INFINITY;
    const float mf = fmaxf(m, sink);
    if (mf == -INFINITY) {
      *factor = 0.f;
      *lse = -INFINITY;
      return;
    }
    const float scale = exp2f(m - mf);
    const float den = l * scale + exp2f(sink - mf);
    *factor = scale / den;
    *lse = (mf + log2f(den)) * kLn2;
  }
  // Writes two adjacent output columns (d even) of CTA row r.
  __device__ void Emit(int r, int d, float v0, float v1, float lse, bool write_lse) const {
    const int rr = row0 + r;
    const int tok = rr / a.group;
    if (tok >= sq) return;
    if (a.num_splits > 1) {
      const size_t prow = part * kRows + r;
      *reinterpret_cast<float2*>(a.partial_o + prow * D + d) = make_float2(v0, v1);
      if (write_lse) a.partial_lse[prow] = lse;
      return;
    }
    const size_t orow =
        static_cast<size_t>(q_begin + tok) * a.num_q_heads + kvh * a.group + rr % a.group;
    StoreOut<T, D>(a, orow, d, v0, v1);
    if (write_lse && a.lse) a.lse[orow] = lse;
  }
};

template <class C>
__global__ void __launch_bounds__(C::kThreads, C::kMinBlocks) FmhaFwdKernel(const KernelArgs a) {
  using T = typename C::Elem;
  constexpr int D = C::kHeadDim;
  constexpr int kN = C::kTileN;
  constexpr int kLd = C::kLd;
  constexpr int kMT = C::kMT;
  constexpr int kChunks = C::kChunks;
  constexpr int kDTiles = D / 16;
  constexpr int kSlots = gpu::kRowSlots;
  constexpr int kQKUnroll = C::kQKUnroll;
  extern __shared__ __align__(16) uint8_t smem[];
  uint16_t* q_smem = reinterpret_cast<uint16_t*>(smem);
  uint16_t* kv_smem = reinterpret_cast<uint16_t*>(smem + C::kQBytes);  // [stage][K|V][kN][kLd]
  int32_t* ids_smem = reinterpret_cast<int32_t*>(smem + C::kQBytes + C::kKvBytes);  // [3][8]

  const int tid = threadIdx.x;
  const int warp = gpu::WarpId();
  const int rw = warp / C::kTokW, tw = warp % C::kTokW;
  const CtaWork work = MakeCtaWork(a, C::kRows, kN);
  if (work.past_end) return;
  const int kvh = work.kvh, split = work.split, tile = work.tile, b = work.b;
  const int q_begin = work.q_begin, sq = work.sq, sk = work.sk, row0 = work.row0;
  const TileList& tl = work.tl;
  const int v_begin = tl.v_begin, v_end = tl.v_end;

  // ---- Q tile -> shared memory (zero rows past the sequence).
  {
    const uint16_t* q = a.q;
    for (int idx = tid; idx < C::kRows * C::kCopyChunks; idx += C::kThreads) {
      const int r = idx / C::kCopyChunks, c = idx % C::kCopyChunks;
      bool valid;
      const size_t src = QueryRowOffset<D>(a, work, row0 + r, &valid);
      gpu::CopyAsync16(q_smem + r * kLd + c * 8, q + src + c * 8, valid);
    }
    gpu::AsyncCommit();
  }

  // ---- KV tile copies: each thread copies a fixed 16-byte chunk of kPasses fixed rows.
  const int my_chunk = tid % C::kCopyChunks, my_row = tid / C::kCopyChunks;
  const int32_t* bt =
      a.block_table ? a.block_table + static_cast<size_t>(b) * a.max_blocks_per_seq : nullptr;
  const int64_t key_base = bt ? 0 : ContiguousKeyBase(a, b);
  // KV row index (row * D = element offset; < 2^31 rows, i.e. any cache that fits in memory) of
  // this thread's rows in the next tile, -1 past the end: the dependent block-table loads run one
  // tile ahead of the copies.
  int32_t next_row[C::kPasses];
  // Block ids of tile v -> ring slot v % 3 (kIdsInSmem; only ids of blocks holding needed keys).
  auto copy_ids = [&](int v) {
    if (!bt || tid >= C::kIdsPerTile) return;
    const int bi = (v < v_end ? tl.TileOf(v) * kN : 0) / a.block_size + tid;
    const bool valid = v < v_end && bi * a.block_size <= tl.max_hi;
    gpu::CopyAsync4(ids_smem + (v % 3) * 8 + tid, bt + (valid ? bi : 0), valid);
  };
  auto fetch = [&](int v) {
    const int t0 = v < v_end ? tl.TileOf(v) * kN : 0;
    const int b0 = t0 / a.block_size;
#pragma unroll
    for (int i = 0; i < C::kPasses; ++i) {
      const int j = t0 + my_row + i * C::kRowsPerPass;
      int64_t row = -1;
      // Only keys some row of this CTA can see are read (others, and the block-table entries of
      // blocks wholly outside every window, may hold anything); the rest are zero-filled.
      if (v < v_end && tl.Needed(j)) {
        if (bt) {
          const int blk =
              C::kIdsInSmem ? ids_smem[(v % 3) * 8 + j / a.block_size - b0] : bt[j / a.block_size];
          row = PagedKvRow(a, blk, kvh, j);
        } else {
          row = ContiguousKvRow(a, key_base, kvh, j);
        }
      }
      next_row[i] = static_cast<int32_t>(row);
    }
  };
  auto issue = [&](int stage) {
    uint16_t* ks = kv_smem + stage * 2 * kN * kLd;
    uint16_t* vs = ks + kN * kLd;
#pragma unroll
    for (int i = 0; i < C::kPasses; ++i) {
      const int r = my_row + i * C::kRowsPerPass;
      const bool valid = next_row[i] >= 0;
      const size_t off = valid ? static_cast<size_t>(next_row[i]) * D + my_chunk * 8 : 0;
      gpu::CopyAsync16(ks + r * kLd + my_chunk * 8, a.k + off, valid);
      gpu::CopyAsync16(vs + r * kLd + my_chunk * 8, a.v + off, valid);
    }
  };

  // ---- Online-softmax state per row. Row slot s of MMA tile mt of this lane is CTA row
  // row_base + mt * 16 + gpu::SlotRow(s).
  const int row_base = rw * kMT * 16;
  float m_run[kMT][kSlots], l_run[kMT][kSlots];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      m_run[mt][s] = -INFINITY;
      l_run[mt][s] = 0.f;
    }
  }
  gpu::FragC o[kMT][kDTiles];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int dd = 0; dd < kDTiles; ++dd) gpu::Zero(o[mt][dd]);
  }

  // ---- Pipeline prologue: Q (group 0) and, with two stages, the first KV tile (group 1).
  if constexpr (C::kIdsInSmem) {  // the first two tiles' block ids land with Q
    copy_ids(v_begin);
    copy_ids(v_begin + 1);
    gpu::AsyncCommit();
    gpu::AsyncWait<0>();
    __syncthreads();
  }
  if constexpr (C::kNumStages == 2) {
    fetch(v_begin);
    issue(0);
    if constexpr (C::kIdsInSmem) copy_ids(v_begin + 2);
    gpu::AsyncCommit();
    if constexpr (C::kPrefetchRows) fetch(v_begin + 1);
    gpu::AsyncWait<1>();
  } else {
    gpu::AsyncWait<0>();
  }
  __syncthreads();
  gpu::FragA qa_reg[C::kQInRegs ? kDTiles : 1];
  if constexpr (C::kQInRegs) {
#pragma unroll
    for (int kk = 0; kk < kDTiles; ++kk)
      gpu::LoadA(qa_reg[kk], q_smem + row_base * kLd + kk * 16, kLd);
  }

  const bool has_alibi = a.alibi_slopes != nullptr;
  const bool fold_scale = !a.has_softcap && !has_alibi && a.scale_log2 > 0.f;
  const float exp_mul = fold_scale ? a.scale_log2 : 1.f;  // scores -> log2 units inside exp2
  for (int v = v_begin; v < v_end; ++v) {
    int stage = 0;
    if constexpr (C::kNumStages == 2) {
      stage = (v - v_begin) & 1;
      if (v + 1 < v_end) {
        if constexpr (!C::kPrefetchRows) fetch(v + 1);
        issue(stage ^ 1);
        // Ids of tile v + 3 into the slot of tile v, whose ids every thread read before the last
        // barrier; they complete with this group, two iterations before fetch(v + 3).
        if constexpr (C::kIdsInSmem) copy_ids(v + 3);
        gpu::AsyncCommit();
        if constexpr (C::kPrefetchRows) fetch(v + 2);
        gpu::AsyncWait<1>();
      } else {
        gpu::AsyncWait<0>();
      }
    } else {
      fetch(v);
      issue(0);
      gpu::AsyncCommit();
      gpu::AsyncWait<0>();
    }
    __syncthreads();

    const int t0 = tl.TileOf(v) * kN;
    // Mask arithmetic only where some row does not see the whole tile.
    const bool need_mask = tl.NeedsMask(t0, kN, a.sink_tokens);
#pragma unroll 1
    for (int st = 0; st < C::kSteps; ++st) {
      const int n0 = tw * C::kNPerWarp + st * C::kStepN;  // this step's first key in the tile
      const uint16_t* ks = kv_smem + (stage * 2 * kN + n0) * kLd;
      const uint16_t* vs = ks + kN * kLd;
      const int key0 = t0 + n0;

      // S = Q K^T for this warp's rows and keys.
      gpu::FragC s[kMT][kChunks];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int c = 0; c < kChunks; ++c) gpu::Zero(s[mt][c]);
      }
#pragma unroll kQKUnroll
      for (int kk = 0; kk < kDTiles; ++kk) {
        gpu::FragA qa[kMT];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          if constexpr (C::kQInRegs) {
            qa[mt] = qa_reg[kk];
          } else {
            gpu::LoadA(qa[mt], q_smem + (row_base + mt * 16) * kLd + kk * 16, kLd);
          }
        }
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
          gpu::FragB kb;
          gpu::LoadBt(kb, ks + c * 16 * kLd + kk * 16, kLd);
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) gpu::Mma<T>(s[mt][c], qa[mt], kb);
        }
      }

      // Scores in log2 units: scale (or soft-cap), ALiBi, mask; per-row maxima. Each feature is
      // one warp-uniform branch around its own pass, so the common path stays short. Without
      // soft-cap and ALiBi the scale (if positive) is folded into the exponent's FMA instead:
      // p = 2^(s * scale - m), with the row maximum taken on the raw scores.
      if (a.has_softcap) {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
          for (int c = 0; c < kChunks; ++c) {
#pragma unroll
            for (int e = 0; e < gpu::kAccElems; ++e) {
              s[mt][c].x[e] = a.softcap_out * Tanh(s[mt][c].x[e] * a.softcap_in);
            }
          }
        }
      } else if (!fold_scale) {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
          for (int c = 0; c < kChunks; ++c) {
#pragma unroll
            for (int e = 0; e < gpu::kAccElems; ++e) s[mt][c].x[e] *= a.scale_log2;
          }
        }
      }
      if (has_alibi) {  // slopes and diagonals recomputed, not held in registers: rare feature
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          float slope[kSlots];
          int diag[kSlots];
#pragma unroll
          for (int sl = 0; sl < kSlots; ++sl) {
            const int rr = row0 + row_base + mt * 16 + gpu::SlotRow(sl);
            slope[sl] = a.alibi_slopes[kvh * a.group + rr % a.group] * kLog2e;
            diag[sl] = DiagonalKey(a, rr / a.group, sq, sk);
          }
#pragma unroll
          for (int c = 0; c < kChunks; ++c) {
#pragma unroll
            for (int e = 0; e < gpu::kAccElems; ++e) {
              const int sl = gpu::AccSlot(e);
              const int j = key0 + c * 16 + gpu::AccCol(e);
              s[mt][c].x[e] += slope[sl] * static_cast<float>(j - diag[sl]);
            }
          }
        }
      }
      if (need_mask) {  // row windows recomputed here rather than held in registers
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          RowWindow win[kSlots];
#pragma unroll
          for (int sl = 0; sl < kSlots; ++sl) {
            win[sl] =
                MakeWindow(a, (row0 + row_base + mt * 16 + gpu::SlotRow(sl)) / a.group, sq, sk);
          }
#pragma unroll
          for (int c = 0; c < kChunks; ++c) {
#pragma unroll
            for (int e = 0; e < gpu::kAccElems; ++e) {
              const RowWindow& w = win[gpu::AccSlot(e)];
              const int j = key0 + c * 16 + gpu::AccCol(e);
              if (!(j <= w.hi && (j >= w.lo || j < a.sink_tokens))) s[mt][c].x[e] = -INFINITY;
            }
          }
        }
      }
      float mx[kMT][kSlots];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int sl = 0; sl < kSlots; ++sl) mx[mt][sl] = -INFINITY;
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
#pragma unroll
          for (int e = 0; e < gpu::kAccElems; ++e) {
            mx[mt][gpu::AccSlot(e)] = fmaxf(mx[mt][gpu::AccSlot(e)], s[mt][c].x[e]);
          }
        }
      }
      // Online softmax update.
      float alpha[kMT][kSlots], m_use[kMT][kSlots];
      bool unchanged = true;
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int sl = 0; sl < kSlots; ++sl) {
          const float m_new = fmaxf(m_run[mt][sl], gpu::RowMax(mx[mt][sl]) * exp_mul);
          m_use[mt][sl] = m_new == -INFINITY ? 0.f : m_new;  // fully masked so far: no NaN
          alpha[mt][sl] = gpu::Exp2(m_run[mt][sl] - m_use[mt][sl]);
          unchanged = unchanged && alpha[mt][sl] == 1.f;
          m_run[mt][sl] = m_new;
          l_run[mt][sl] *= alpha[mt][sl];
        }
      }
      // Rescale O unless no row's maximum moved (warp-uniform skip; common late in long rows).
      if (!gpu::WarpAll(unchanged)) {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
          for (int dd = 0; dd < kDTiles; ++dd) {
#pragma unroll
            for (int e = 0; e < gpu::kAccElems; ++e) o[mt][dd].x[e] *= alpha[mt][gpu::AccSlot(e)];
          }
        }
      }
      // P = exp2(s - m), O += P V.
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        gpu::FragA pa[kMT];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
          for (int e = 0; e < gpu::kAccElems; ++e) {
            const int sl = gpu::AccSlot(e);
            const float p = gpu::Exp2(fmaf(s[mt][c].x[e], exp_mul, -m_use[mt][sl]));
            l_run[mt][sl] += p;
            s[mt][c].x[e] = p;
          }
          pa[mt] = gpu::AccToA<T>(s[mt][c]);
        }
#pragma unroll
        for (int dd = 0; dd < kDTiles; ++dd) {
          gpu::FragB vb;
          gpu::LoadB(vb, vs + c * 16 * kLd + dd * 16, kLd);
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) gpu::Mma<T>(o[mt][dd], pa[mt], vb);
        }
      }
    }
    __syncthreads();  // the next iteration's copies overwrite this stage
  }
  gpu::AsyncWait<0>();

  // ---- Epilogue. Each lane summed only its own columns.
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int sl = 0; sl < kSlots; ++sl) l_run[mt][sl] = gpu::RowSum(l_run[mt][sl]);
  }
  const OutputWriter<T, D, C::kRows> writer(a, b, kvh, tile, split, row0, q_begin, sq);

  if constexpr (C::kTokW == 1) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      float factor[kSlots], lse[kSlots];
#pragma unroll
      for (int sl = 0; sl < kSlots; ++sl) {
        writer.Finalize(row_base + mt * 16 + gpu::SlotRow(sl), m_run[mt][sl], l_run[mt][sl],
                        &factor[sl], &lse[sl]);
      }
#pragma unroll
      for (int dd = 0; dd < kDTiles; ++dd) {
#pragma unroll
        for (int e = 0; e < gpu::kAccElems; e += 2) {
          const int sl = gpu::AccSlot(e);
          writer.Emit(row_base + mt * 16 + gpu::AccRow(e), dd * 16 + gpu::AccCol(e),
                      o[mt][dd].x[e] * factor[sl], o[mt][dd].x[e + 1] * factor[sl], lse[sl],
                      dd == 0 && gpu::AccCol(e) == 0);
        }
      }
    }
  } else {
    // Token-split warps: merge (m, l, O) of the same 16 rows through shared memory.
    constexpr int kOLd = D + 2;
    float* ms = reinterpret_cast<float*>(smem);  // [warp][16]
    float* ls = ms + C::kWarps * 16;             // [warp][16]
    float* os = ls + C::kWarps * 16;             // [warp][16][kOLd]
    __syncthreads();                             // everyone is done with the KV tiles
    if (gpu::AccCol(0) == 0) {
#pragma unroll
      for (int sl = 0; sl < kSlots; ++sl) {
        ms[warp * 16 + gpu::SlotRow(sl)] = m_run[0][sl];
        ls[warp * 16 + gpu::SlotRow(sl)] = l_run[0][sl];
      }
    }
#pragma unroll
    for (int dd = 0; dd < kDTiles; ++dd) {
#pragma unroll
      for (int e = 0; e < gpu::kAccElems; ++e) {
        os[(warp * 16 + gpu::AccRow(e)) * kOLd + dd * 16 + gpu::AccCol(e)] = o[0][dd].x[e];
      }
    }
    __syncthreads();
    for (int idx = tid; idx < 16 * (D / 2); idx += C::kThreads) {
      const int r = idx / (D / 2), d = 2 * (idx % (D / 2));
      float m = -INFINITY;
#pragma unroll
      for (int w = 0; w < C::kWarps; ++w) m = fmaxf(m, ms[w * 16 + r]);
      const float m_ref = m == -INFINITY ? 0.f : m;
      float l = 0.f, v0 = 0.f, v1 = 0.f;
#pragma unroll
      for (int w = 0; w < C::kWarps; ++w) {
        const float f = exp2f(ms[w * 16 + r] - m_ref);
        l += ls[w * 16 + r] * f;
        v0 += os[(w * 16 + r) * kOLd + d] * f;
        v1 += os[(w * 16 + r) * kOLd + d + 1] * f;
      }
      float factor, lse;
      writer.Finalize(r, m, l, &factor, &lse);
      writer.Emit(r, d, v0 * factor, v1 * factor, lse, d == 0);
    }
  }
}

// Combines the split-KV partials of one row tile: grid (row_tiles, kv_heads, batch).
template <int D, int kRows, typename T>
__global__ void __launch_bounds__(256) FmhaMergeKernel(const KernelArgs a) {
  const int tile = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
  const int q_begin = a.seqstart_q ? a.seqstart_q[b] : b * a.seqlen_q;
  const int sq = a.seqstart_q ? a.seqstart_q[b + 1] - q_begin : a.seqlen_q;
  const int row0 = tile * kRows;
  const size_t part0 =
      ((static_cast<size_t>(b) * a.num_kv_heads + kvh) * a.row_tiles + tile) * a.num_splits;
  for (int idx = threadIdx.x; idx < kRows * (D / 2); idx += blockDim.x) {
    const int r = idx / (D / 2), d = 2 * (idx % (D / 2));
    const int rr = row0 + r;
    const int tok = rr / a.group;
    if (tok >= sq) continue;
    const int head = kvh * a.group + rr % a.group;
    const float sink = a.sink_logits ? a.sink_logits[head] * kLog2e : -INFINITY;
    float m = sink;
    for (int s = 0; s < a.num_splits; ++s) m = fmaxf(m, a.partial_lse[(part0 + s) * kRows + r]);
    const size_t orow = static_cast<size_t>(q_begin + tok) * a.num_q_heads + head;
    if (m == -INFINITY) {
      StoreOut<T, D>(a, orow, d, 0.f, 0.f);
      if (d == 0 && a.lse) a.lse[orow] = -INFINITY;
      continue;
    }
    float den = exp2f(sink - m), v0 = 0.f, v1 = 0.f;
    for (int s = 0; s < a.num_splits; ++s) {
      const size_t prow = (part0 + s) * kRows + r;
      const float w = exp2f(a.partial_lse[prow] - m);
      den += w;
      if (w > 0.f) {
        const float2 x = *reinterpret_cast<const float2*>(a.partial_o + prow * D + d);
        v0 += w * x.x;
        v1 += w * x.y;
      }
    }
    StoreOut<T, D>(a, orow, d, v0 / den, v1 / den);
    if (d == 0 && a.lse) a.lse[orow] = (m + log2f(den)) * kLn2;
  }
}

// ---------------------------------------------------------------------------------------------
// Host side (compiled by nvcc / hipcc).

// Kernel configurations. Two stages where cp.async exists; HIP keeps shared memory under 64 KB.
template <typename T, int D>
struct Configs {
  static constexpr int kStages = gpu::kHasAsyncCopy ? 2 : 1;
  using Prefill = Cfg<T, D, 4, 1, 2, gpu::kHasAsyncCopy ? 64 : 32, kStages>;
  using PrefillSmall = Cfg<T, D, 4, 1, 2, 32, kStages>;  // see UseBigPrefill
  using Decode = Cfg<T, D, 1, 4, 1, 64, kStages>;
  static_assert(Prefill::kRows == kPrefillRows && Decode::kRows == kDecodeRows, "row tiles");
};

// Head dim 256: one 16-row MMA tile per warp (its fp32 accumulator is 128 registers per lane), so
// prefill tiles have 64 rows; 32-key tiles (16 on HIP and on the small variant: sm_80-class and
// 99 KB devices). Decode: two token warps of 16 keys, 64 threads, so three CTAs' register
// allocations fit an SM and two CTAs' shared memory (76 KB each on CUDA).
template <typename T>
struct Configs<T, 256> {
  static constexpr int kStages = gpu::kHasAsyncCopy ? 2 : 1;
  using Prefill = Cfg<T, 256, 4, 1, 1, gpu::kHasAsyncCopy ? 32 : 16, kStages>;
  using PrefillSmall = Cfg<T, 256, 4, 1, 1, 16, kStages>;
  using Decode = Cfg<T, 256, 1, 2, 1, 32, kStages>;
  static_assert(Prefill::kRows == kPrefillRowsD256 && Decode::kRows == kDecodeRows, "row tiles");
};

inline KernelArgs MakeKernelArgs(const Run& run) {
  const FmhaParams& p = run.p;
  KernelArgs a{};
  a.q = static_cast<const uint16_t*>(p.q);
  a.out = static_cast<uint16_t*>(p.out);
  a.out_fp8 = static_cast<uint8_t*>(p.out_fp8);
  a.out_inv_scale = p.out_fp8_inv_scale;
  a.lse = p.lse;
  a.k = static_cast<const uint16_t*>(p.k);
  a.v = static_cast<const uint16_t*>(p.v);
  a.seqstart_q = p.seqstart_q;
  a.seqlen_k = p.seqlen_k;
  a.block_table = p.block_size > 0 ? p.block_table : nullptr;
  a.cache_batch_idx = p.block_size > 0 ? nullptr : p.cache_batch_idx;
  a.seqstart_k = p.block_size > 0 ? nullptr : p.seqstart_k;
  a.alibi_slopes = p.alibi_slopes;
  a.sink_logits = p.sink_logits;
  a.partial_o = run.partial_o;
  a.partial_lse = run.partial_lse;
  a.seqlen_q = p.seqlen_q;
  a.num_q_heads = p.num_q_heads;
  a.num_kv_heads = p.num_kv_heads;
  a.group = p.num_q_heads / p.num_kv_heads;
  a.block_size = p.block_size;
  a.block_shift = -1;
  for (int sh = 0; sh < 31; ++sh) {
    if (p.block_size == (1 << sh)) a.block_shift = sh;
  }
  a.max_blocks_per_seq = p.max_blocks_per_seq;
  a.cache_seqlen = p.cache_seqlen;
  a.mask_type = static_cast<int>(p.mask.type);
  a.window_left = p.mask.window_left;
  a.window_right = p.mask.window_right;
  a.sink_tokens = p.mask.sink_tokens;
  a.scale_log2 = p.softmax_scale * kLog2e;
  a.has_softcap = p.softcap > 0.f;
  a.softcap_in = a.has_softcap ? p.softmax_scale / p.softcap : 0.f;
  a.softcap_out = a.has_softcap ? p.softcap * kLog2e : 0.f;
  a.row_tiles = run.row_tiles;
  a.num_splits = run.num_splits;
  return a;
}

// Raises the dynamic shared-memory limit once per instantiation (a host call, cached).
template <class C>
const char* PrepareKernel() {
  static const gpu::Error err =
      gpu::SetMaxDynamicSmem(reinterpret_cast<const void*>(&FmhaFwdKernel<C>), C::kSmemBytes);
  return err == gpu::kSuccess ? nullptr : gpu::ErrorString(err);
}

template <class C>
const char* LaunchConfig(const KernelArgs& a, int batch, gpu::Stream stream) {
  if (const char* e = PrepareKernel<C>()) return e;
  const dim3 grid(a.num_kv_heads * a.num_splits, a.row_tiles, batch);
  FmhaFwdKernel<C><<<grid, C::kThreads, C::kSmemBytes, stream>>>(a);
  LLM_GPU_TRY(gpu::GetLastError());
  if (a.num_splits > 1) {
    FmhaMergeKernel<C::kHeadDim, C::kRows, typename C::Elem>
        <<<dim3(a.row_tiles, a.num_kv_heads, batch), 256, 0, stream>>>(a);
    LLM_GPU_TRY(gpu::GetLastError());
  }
  return nullptr;
}

// Whether the current device runs the big prefill tile (two 128x64 CTAs per SM, 104 KB each at
// head_dim 128: sm_90) or the 128x32 one (sm_80, consumer Blackwell's 99 KB per block).
// Cached per device index.
template <class Big>
bool UseBigPrefill() {
  static int cached_dev = -1;
  static bool cached = false;
  int dev = 0;
  if (gpu::CurrentDevice(&dev) != gpu::kSuccess) return false;
  if (dev != cached_dev) {
    int optin = 0, per_sm = 0;
    if (gpu::SmemOptinBytes(dev, &optin) != gpu::kSuccess ||
        gpu::SmemPerSmBytes(dev, &per_sm) != gpu::kSuccess) {
      return false;
    }
    // 1 KB per CTA is reserved by the runtime on recent GPUs.
    cached = optin >= Big::kSmemBytes && per_sm >= 2 * (Big::kSmemBytes + 1024);
    cached_dev = dev;
  }
  return cached;
}

// Occupancy of one configuration (cached: like PrepareKernel, assumes one kind of device).
template <class C>
const char* ResidentCtas(int* n) {
  static int cached = 0;
  if (cached == 0) {
    if (const char* e = PrepareKernel<C>()) return e;
    LLM_GPU_TRY(gpu::MaxActiveBlocks(&cached, reinterpret_cast<const void*>(&FmhaFwdKernel<C>),
                                     C::kThreads, C::kSmemBytes));
  }
  *n = cached;
  return nullptr;
}

template <typename T, int D>
const char* ResidentCtasHeadDim(const Run& run, int* n) {
  using Cf = Configs<T, D>;
  if (run.layout == Layout::kDecode) return ResidentCtas<typename Cf::Decode>(n);
  if (UseBigPrefill<typename Cf::Prefill>()) return ResidentCtas<typename Cf::Prefill>(n);
  return ResidentCtas<typename Cf::PrefillSmall>(n);
}

template <typename T>
const char* ResidentCtasElem(const Run& run, int* n) {
  if (run.p.head_dim == 64) return ResidentCtasHeadDim<T, 64>(run, n);
  if (run.p.head_dim == 256) return ResidentCtasHeadDim<T, 256>(run, n);
  return ResidentCtasHeadDim<T, 128>(run, n);
}

template <typename T, int D>
const char* LaunchHeadDim(const Run& run, void* stream) {
  using Cf = Configs<T, D>;
  const KernelArgs a = MakeKernelArgs(run);
  auto s = static_cast<gpu::Stream>(stream);
  if (run.layout == Layout::kDecode) return LaunchConfig<typename Cf::Decode>(a, run.p.batch, s);
  if (UseBigPrefill<typename Cf::Prefill>()) {
    return LaunchConfig<typename Cf::Prefill>(a, run.p.batch, s);
  }
  return LaunchConfig<typename Cf::PrefillSmall>(a, run.p.batch, s);
}

template <typename T>
const char* LaunchElem(const Run& run, void* stream) {
  if (run.p.head_dim == 64) return LaunchHeadDim<T, 64>(run, stream);
  if (run.p.head_dim == 256) return LaunchHeadDim<T, 256>(run, stream);
  return LaunchHeadDim<T, 128>(run, stream);
}

}  // namespace llm::fmha
