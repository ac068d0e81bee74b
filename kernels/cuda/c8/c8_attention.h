// C8 append attention on CUDA: paged KV cache in bf16, int8 or fp8-e4m3 with per-head,
// per-channel or per-token (dynamic) scales; GQA groups packed into the query tile; prefill,
// append and decode (1..N query tokens per sequence, causal) in one launch; split-KV with a
// merge step; sliding windows and learned sink logits (LayerArgs). Plain C++ header: no CUDA types,
// so host code and tests include it freely.
//
// Plan/run split: C8Planner::Plan builds the work list on the host once per step and uploads it;
// C8Attention::Run only consumes the uploaded plan, so decode steps can be graph-captured.
#pragma once

#include <cstdint>
#include <vector>

#include "base/status.h"
#include "kernels/attention_backend.h"
#include "kernels/cuda/common/device_info.h"
#include "kernels/cuda/common/plan_area.h"
#include "kernels/fmha/fmha_params.h"

namespace llm::cuda {

// kInt8 bytes are stored excess-128 (byte = q ^ 0x80 for the quantized value q in [-127, 127]):
// the tile kernel's magic-number dequantization then needs no fix-up instruction.
enum class CacheType { kBf16, kInt8, kFp8E4M3 };
enum class ScaleMode {
  kNone,        // bf16 cache
  kPerHead,     // k_scale/v_scale: [num_kv_heads]
  kPerChannel,  // k_scale/v_scale: [num_kv_heads, head_dim]
  kPerToken,  // dynamic: k_scale/v_scale: [num_blocks, num_kv_heads, block_size], written by append
};

struct C8Shape {
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 128;  // 64 or 128
  int block_size = 64;
  CacheType cache = CacheType::kBf16;
  ScaleMode scale = ScaleMode::kNone;
};

// One unit of kernel work: a query tile of one sequence against a KV range, for every KV head.
// It carries everything the kernel needs about its sequence, so a CTA's first dependent loads are
// this item (two 16-byte loads) and then its first page ids.
struct alignas(16) C8WorkItem {
  int32_t q_start;   // first query row of the tile in the flattened batch
  int32_t q_len;     // query tokens in the tile
  int32_t kv_start;  // KV range [kv_start, kv_end) of this chunk
  int32_t kv_end;
  int32_t partial;    // -1: write the output directly; else index of this chunk's partial slot
  int32_t merge;      // with a partial: index of the C8MergeItem that combines it (else -1)
  int32_t page_base;  // the sequence's first entry in the block table (page_indptr[seq])
  int32_t q_pos0;     // causal position of the tile's first query token (sees keys [0, q_pos0],
                      // or its window of them: the kernel starts kv_start at that window)
};

// Combines the partial results of one split query tile. The tile kernel's CTA that finishes a
// tile's last chunk (per KV head, counted atomically) merges them: no separate merge launch.
struct C8MergeItem {
  int32_t q_start;
  int32_t q_len;
  int32_t first_partial;
  int32_t num_partials;
};

constexpr int kC8MaxDecodeStages = 4;  // deepest decode cp.async ring

struct C8PlanConfig {
  int num_sms = 132;
  int ctas_per_sm = 2;         // resident decode CTAs per SM (C8Attention::decode_ctas_per_sm())
  int min_chunk_tokens = 128;  // never split KV finer than this
  int max_splits = 64;
  int max_decode_items = 0;  // > 0: never plan more decode items (a graph bucket's grid)
  // > 0: sequences of up to this many query rows take decode tiles, several per sequence where
  // rows x GQA group exceed one tile (a graph step's verify rows); 0: only those that fit one.
  int decode_query_len = 0;
  bool force_split = false;  // tests: split every tile into min_chunk_tokens chunks
  // Resident decode CTAs per SM for each ring depth (index: stages 2..4; 0 where that ring does
  // not fit the device). All zero: the cache type's default ring at ctas_per_sm.
  int ring_ctas_per_sm[kC8MaxDecodeStages + 1] = {};
  // Decode ring depth (2..4) forced on the plan, with ctas_per_sm its occupancy (benchmarks,
  // tests); 0: the planner picks from ring_ctas_per_sm.
  int decode_stages = 0;
};

// Host-side plan for one step. Kernel work is grouped by tile kind: decode tiles pack up to 16
// rows (query tokens x GQA group); prefill tiles pack 128 rows. KV is split into chunks (merged
// afterwards) when that fills the GPU's resident CTA slots in fewer, fuller waves.
struct C8Plan {
  std::vector<C8WorkItem> decode_items;
  std::vector<C8WorkItem> prefill_items;
  std::vector<C8MergeItem> merges;
  int num_partials = 0;  // partial slots, each [kPartialRows x head_dim] fp32 + lse per KV head
  int decode_tile_tokens = 0;
  int decode_stages = 0;  // decode ring depth for the launch; 0: the cache type's default
  int decode_rows = 0;    // most query rows (query tokens x GQA group) of a decode item
  int prefill_tile_tokens = 0;
};

// Builds the plan from the shared CSR batch description.
C8Plan BuildC8Plan(const C8Shape& shape, const AttentionBatch& batch, const C8PlanConfig& config);

// Device-side state for one C8 attention instance: uploaded plan, batch arrays, workspace.
//
// Two upload areas. Upload (any batch) packs the step tightly and the launches use its exact
// counts. UploadGraph (decode-shaped steps: the same 1..max_q query tokens per sequence) writes a
// fixed layout reserved once by ReserveGraph; the launches after it cover a capacity set by the
// step's GraphShape and read the real counts from device memory, and every pointer they pass is
// fixed. The launches of one shape can then be captured in a CUDA graph once and replayed after
// each UploadGraph for it.
class C8Attention {
 public:
  explicit C8Attention(const C8Shape& shape);
  ~C8Attention();
  C8Attention(const C8Attention&) = delete;
  C8Attention& operator=(const C8Attention&) = delete;

  // Uploads the batch's CSR arrays and the plan (async on `stream`, a cudaStream_t).
  Status Upload(const AttentionBatch& batch, const C8Plan& plan, void* stream);

  // Graph area for decode-shaped steps of up to max_seqs sequences of up to max_q query tokens
  // each, and max_pages block-table entries.
  Status ReserveGraph(int max_seqs, int max_pages, int max_q = 1);
  // Decode tiles one sequence of q query tokens takes (rows x GQA group split into tiles).
  int DecodeTilesPerSeq(int q) const;
  // Decode items a shape's grid covers: the plan for it must stay within (max_decode_items, with
  // decode_query_len = shape.q so that every row takes a decode tile).
  int GraphItemCapacity(GraphShape shape) const;
  int GraphItemCapacity(int bucket) const { return GraphItemCapacity(GraphShape{bucket, 1}); }
  // Uploads a decode-shaped step (num_seqs <= shape.seqs <= max_seqs, shape.q tokens each) into
  // the graph area; rows [num_tokens, shape.rows()) are padding (their K/V is not appended,
  // their output not written).
  Status UploadGraph(const AttentionBatch& batch, const C8Plan& plan, GraphShape shape,
                     void* stream);
  Status UploadGraph(const AttentionBatch& batch, const C8Plan& plan, int bucket, void* stream) {
    return UploadGraph(batch, plan, GraphShape{bucket, 1}, stream);
  }

  struct LayerArgs {
    const void* q = nullptr;      // bf16 [num_tokens, num_q_heads, head_dim]
    const void* k_new = nullptr;  // bf16 [num_tokens, num_kv_heads, head_dim]
    const void* v_new = nullptr;
    void* out = nullptr;  // bf16 [num_tokens, num_q_heads, head_dim]
    // Set: instead of out, e4m3 bytes [num_tokens, num_q_heads, head_dim] of the output times
    // out_fp8_inv_scale (saturating), for an fp8 o_proj whose input scale is static: with a
    // static 8-bit cache every output is a convex combination of dequantized V rows, so
    // qmax x max(v_scale) bounds it and 448 / that bound is a scale no row can overflow.
    void* out_fp8 = nullptr;
    float out_fp8_inv_scale = 1.0f;
    void* k_cache = nullptr;  // [num_blocks, num_kv_heads, block_size, head_dim] of cache type
    void* v_cache = nullptr;
    float* k_scale = nullptr;  // see ScaleMode; written by append only for kPerToken
    float* v_scale = nullptr;
    float softmax_scale = 1.0f;
    // The layer's sliding window (a query at position p sees keys [p - window_left, p]; -1: the
    // whole prefix) and learned per-head sink logits ([num_q_heads] fp32 on the device, or null),
    // as AttentionParams defines them. Blocks wholly left of the first query's window may be -1
    // in the block table (freed): no kernel reads them.
    int window_left = -1;
    const float* sink_logits = nullptr;
    // With rope.qkv set: the rotary is fused into the append, which writes rope.q (attended
    // instead of q) and reads no k_new / v_new.
    FusedRope rope;
  };
  // Appends (quantizing) the new K/V, then attends; uses the last upload (either kind).
  Status Run(const LayerArgs& args, void* stream);
  // Attention only (cache already holds the new tokens): for benchmarks.
  Status Attend(const LayerArgs& args, void* stream);

  // Prefill sequences of 8-bit caches through the sm_90a wgmma FMHA kernel (kernels/fmha/): each
  // eager step with prefill tiles dequantizes those sequences' cached K/V (x = q * scale, rounded
  // to bf16) into packed rows and attends over them there, at about twice the C8 prefill tiles'
  // rate; the decode tiles are unchanged. A step falls back to the tiles when its prefill rows
  // are not contiguous in the batch or its keys exceed kMaxFmhaPrefillKeyBytes. Where the FMHA
  // kernel cannot run (a 16-bit cache, not compute capability 9.0, a build without sm_90a)
  // turning it on is InvalidArgument. Call between steps.
  Status SetPrefillFmha(bool on);
  bool prefill_fmha() const { return prefill_fmha_; }
  // Whether the last upload's prefill sequences go through the FMHA kernel.
  bool step_uses_fmha() const { return active_->fmha; }
  static constexpr size_t kMaxFmhaPrefillKeyBytes = size_t{256} << 20;  // bf16 K + V copy

  const C8Shape& shape() const { return shape_; }
  // Resident decode CTAs per SM on the current device for a decode ring depth: 0 asks for the
  // cache type's default (lowered to what the device fits); 2..4 for that ring, 0 if it does not
  // fit.
  int decode_ctas_per_sm(int stages = 0) const;
  // The planner's configuration on the current device: SMs, and the occupancy of every ring.
  C8PlanConfig plan_config() const;

 private:
  // One upload area: device ints (block table, slots, work and merge items) with their pinned
  // staging, partial outputs, offsets in int32 elements, and what the launches cover.
  struct Area {
    PlanArea ints;
    void* d_partial = nullptr;  // partial outputs + lse
    size_t d_partial_cap = 0;
    // [merge items x num_kv_heads] chunks finished so far; zero between launches (the merging
    // CTA resets its counter).
    int* d_counters = nullptr;
    size_t d_counters_cap = 0;  // bytes
    size_t off_counts = 0, off_pages = 0, off_slots = 0, off_decode = 0, off_prefill = 0,
           off_merge = 0;
    int num_partials = 0;  // partial slots the partial buffer is laid out for
    // Grid extents of the launches, and whether the kernels read the exact counts on the device.
    int num_tokens = 0, num_decode = 0, num_prefill = 0;
    int decode_stages = 0;  // the plan's decode ring depth
    int decode_rows = 0;    // the plan's most query rows per decode item
    bool device_counts = false;
    // FMHA prefill (SetPrefillFmha): this upload's prefill sequences, their rows [fmha_row0,
    // fmha_row0 + fmha_rows) of the batch, and [seqstart_q: n + 1][seqlen_k: n][seqstart_k: n + 1]
    // [page_base: n] at off_fmha (seqstart_q relative to fmha_row0).
    bool fmha = false;
    size_t off_fmha = 0;
    int fmha_seqs = 0, fmha_row0 = 0, fmha_max_q = 0, fmha_max_k = 0, fmha_keys = 0;
    int fmha_splits = 1;
    ~Area();
  };
  Status EnsureCounters(Area* a, int merges, void* stream);
  // Sets up the eager area's FMHA prefill section when this step can use it (SetPrefillFmha):
  // returns its host values to upload, empty when the step keeps the prefill tiles.
  std::vector<int32_t> PlanFmhaPrefill(const AttentionBatch& batch, const C8Plan& plan);
  Status AttendPrefillFmha(const LayerArgs& args, void* stream);
  // The FMHA launch of an area's prefill section; ints null: host-side planning (stand-ins).
  FmhaParams FmhaPrefillParams(const Area& a, const int32_t* ints) const;

  C8Shape shape_;
  Area eager_, graph_;
  Area* active_ = &eager_;
  GraphCapacity graph_cap_;
  int graph_slots_ = 0;  // resident decode CTA slots of the device (set by ReserveGraph)
  bool prefill_fmha_ = false;
  void* fmha_kv_ = nullptr;  // bf16 K then V copies of the prefill keys (grown per step)
  size_t fmha_kv_cap_ = 0;
  void* fmha_workspace_ = nullptr;  // split-KV partials of the FMHA launch
  size_t fmha_workspace_cap_ = 0;
};

}  // namespace llm::cuda
