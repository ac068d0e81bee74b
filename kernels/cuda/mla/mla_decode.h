// MLA (DeepSeek multi-head latent attention) decode on CUDA: the absorbed form over a paged latent
// cache [num_blocks, block_size, 576] (512 latent + 64 rope) in bf16 or fp8 e4m3 with one per-layer
// scale; 16..128 query heads and 1..kMlaMaxDecodeQueryLen query tokens per sequence (causal; a
// graph step's MlaPlanConfig::max_decode_query_len raises that bound);
// split-KV with a merge kernel. Plain C++ header: no CUDA types.
//
// Plan/run split (like C8): BuildMlaPlan makes the work list on the host once per step,
// MlaDecode::Upload copies it to the device, and Run only consumes it. Decode steps can also take
// the graph form (MlaDecode::ReserveGraph / UploadGraph), whose launches are the same for every
// step of a batch bucket, so a model captures them in a CUDA graph once and replays them. Design
// notes are in mla_decode_kernel.cuh.
#pragma once

#include <cstdint>
#include <vector>

#include "base/status.h"
#include "kernels/attention_backend.h"
#include "kernels/cuda/common/plan_area.h"

namespace llm::cuda {

enum class MlaCacheType { kBf16, kFp8E4M3 };

constexpr int kMlaLatentDim = 512;  // kv_lora_rank: q_latent, PV and output width
constexpr int kMlaRopeDim = 64;
constexpr int kMlaCacheDim = kMlaLatentDim + kMlaRopeDim;  // QK width, cached row width

// Which kernel runs the work items: the portable one (mma.sync, the sm_120 design, every
// architecture) or an sm_90a warpgroup-MMA one (compute capability 9.0 and a build that includes
// sm_90a). bf16 cache: 64-row tiles, smaller items padded (mla_decode_wgmma.cu). fp8 cache: 16-
// and 32-row items, tokens as the MMA's M (mla_decode_fp8_wgmma.cu); 64-row items stay portable.
//   kAuto: every bf16 item and fp8 16/32-row items on wgmma where it can run (TMA and the
//     asynchronous MMA keep more bytes in flight than the portable kernel, padding and all), fp8
//     64-row items on the portable kernel.
//   kWgmma: the same, and an error where it cannot run.
//   kPortable: every item on the portable kernel.
// Current numbers: docs/BENCHMARKS.md; the rules: docs/KERNEL_SELECTION.md.
enum class MlaKernel { kAuto, kPortable, kWgmma };

// How the sm_90a kernel schedules a bf16 cache's items.
//   kSeesaw (mla_decode_seesaw.cu): two warpgroups and no producer; each warpgroup's softmax runs
//     while the other's S = Q K^T has the tensor cores, and a tile's halves are refilled by the
//     warpgroup that read them last. Needs block_size % 64 == 0 (every 64-token tile in one page).
//   kRing (mla_decode_wgmma.cu): a producer warpgroup streams tiles into a two-slot ring; any
//     block size.
//   kAuto: kSeesaw for 64-row items where the block size allows it (the compute-bound ones: 64 and
//     128 heads, 16 heads x 4 query tokens), else kRing.
// Current numbers: docs/BENCHMARKS.md.
enum class MlaBf16Schedule { kAuto, kRing, kSeesaw };

// How the portable kernel multiplies an fp8 cache.
//   kE4m3: fp8 tensor cores (mma m16n8k32 e4m3, sm_89 and later): the cache bytes feed the MMA
//     unconverted; q and P enter as two e4m3 terms each (hi + lo). An error where the device's
//     kernel binary is older than sm_89.
//   kF16: every cache byte converted to f16 in registers (any architecture).
//   kAuto: kE4m3 where it can run, except on Hopper, whose mma.sync e4m3 is no faster than f16
//     so the hi/lo split doubles the tensor time; else kF16.
enum class MlaFp8Math { kAuto, kE4m3, kF16 };

struct MlaDecodeShape {
  int num_heads = 0;  // query heads; every head reads the one latent per token
  int block_size = 64;
  MlaCacheType cache = MlaCacheType::kBf16;
  MlaKernel kernel = MlaKernel::kAuto;
  MlaFp8Math fp8_math = MlaFp8Math::kAuto;
  MlaBf16Schedule bf16_schedule = MlaBf16Schedule::kAuto;
};

// Whether the current device can run the sm_90a MLA kernel (cached per device).
bool MlaWgmmaAvailable();
// Whether the current device runs the e4m3-MMA fp8 kernel (its binary is sm_89+; cached).
bool MlaFp8MmaAvailable();

// One CTA's work: the rows q_len x num_heads of one sequence (row r = token q_start + r /
// num_heads, head head_start + r % num_heads) against cache positions [kv_start, kv_end).
struct MlaWorkItem {
  int32_t seq;
  int32_t q_start;  // first query token of the item in the flattened batch
  int32_t q_len;
  int32_t head_start;
  int32_t num_heads;
  int32_t kv_start;
  int32_t kv_end;   // causal: the position after the item's last query token, or a chunk end
  int32_t partial;  // -1: write out_latent directly; else this chunk's partial slot
};

// Combines the partials [first_partial, first_partial + num_partials) of one split item.
struct MlaMergeItem {
  int32_t q_start;
  int32_t q_len;
  int32_t head_start;
  int32_t num_heads;
  int32_t first_partial;
  int32_t num_partials;
};

// CTA row tiles: 16, 32 or 64 query rows (heads x tokens) per CTA, one kernel variant each.
constexpr int kMlaNumRowVariants = 3;
constexpr int kMlaVariantRows[kMlaNumRowVariants] = {16, 32, 64};
constexpr int kMlaMaxRows = 64;

struct MlaPlanConfig {
  int num_sms = 132;
  // Resident CTAs per SM of each row variant (MlaDecode::ctas_per_sm()).
  int ctas_per_sm[kMlaNumRowVariants] = {1, 1, 1};
  int min_chunk_tokens = 128;  // never split KV finer than this (a multiple of 64)
  int max_splits = 64;         // 1 disables split-KV
  bool force_split = false;    // tests: split every item into min_chunk_tokens chunks
  // Rows (heads x query tokens) per work item, a kMlaVariantRows entry: 64, or 32 where the
  // fp8 wgmma kernel serves up to 32 rows (MlaDecode::plan_config).
  int max_item_rows = kMlaMaxRows;
  // > 0: never plan more work items of row variant v than max_items[v] (a graph bucket's grid;
  // MlaDecode::GraphItemCapacity). Zeros: no bound.
  int max_items[kMlaNumRowVariants] = {0, 0, 0};
  // Sequences of 1..this many query rows are decode sequences (planned here); a graph step of
  // q > kMlaMaxDecodeQueryLen rows per sequence raises it to q, since every row of it is
  // attended here. The kernels take any q whose items fit kMlaMaxRows.
  int max_decode_query_len = kMlaMaxDecodeQueryLen;
};

struct MlaPlan {
  std::vector<MlaWorkItem> items[kMlaNumRowVariants];  // by row variant
  std::vector<MlaMergeItem> merges;
  int num_partials = 0;  // partial slots, each [kMlaMaxRows, 512] fp32 + [kMlaMaxRows] lse
};

// Work for the decode sequences of `batch` (1..config.max_decode_query_len query rows); the rows of
// other sequences get no work. Heads of one token fill a CTA first (max_item_rows at most), then
// tokens: 16 heads x 4 tokens or 32 x 2 share one 64-row CTA, 128 heads take two CTAs per token
// (four of 32 rows over an fp8 cache on Hopper). KV is split
// into chunks (and merged) when that fills the GPU's resident CTA slots in fewer, fuller waves.
MlaPlan BuildMlaPlan(const MlaDecodeShape& shape, const AttentionBatch& batch,
                     const MlaPlanConfig& config);

// Device-side state for one MLA decode instance: uploaded plan, batch arrays, workspace.
class MlaDecode {
 public:
  explicit MlaDecode(const MlaDecodeShape& shape);
  ~MlaDecode();
  MlaDecode(const MlaDecode&) = delete;
  MlaDecode& operator=(const MlaDecode&) = delete;

  // Uploads the batch's CSR arrays and the plan (async on `stream`, a cudaStream_t).
  Status Upload(const AttentionBatch& batch, const MlaPlan& plan, void* stream);

  // Graph form, for decode-shaped steps (the same 1..max_q query tokens per sequence).
  // ReserveGraph fixes a second device area once for up to max_seqs sequences, max_q query rows
  // each and max_pages block-table entries (captured graphs hold its pointers: a second, larger
  // reservation is refused). UploadGraph copies a step (num_seqs <= shape.seqs <= max_seqs, q =
  // shape.q) and its plan into that area from pinned memory; the Runs after it launch grids of
  // the shape's capacities (GraphItemCapacity, GraphMergeCapacity) with fixed pointers, and the
  // kernels read the step's item and merge counts from the area, so surplus CTAs exit at once.
  // Rows [num_tokens, shape.rows()) are padding: no append, no output.
  Status ReserveGraph(int max_seqs, int max_pages, int max_q = 1);
  // Work items of row variant v a shape's grid covers (0: the variant never occurs); the plan of
  // a graph step must stay within them (MlaPlanConfig::max_items, set by GraphPlanConfig).
  int GraphItemCapacity(GraphShape shape, int variant) const;
  int GraphItemCapacity(int bucket, int variant) const {
    return GraphItemCapacity(GraphShape{bucket, 1}, variant);
  }
  // Merge items a shape's merge launch covers: at most one per (token group, head group).
  int GraphMergeCapacity(GraphShape shape) const;
  int GraphMergeCapacity(int bucket) const { return GraphMergeCapacity(GraphShape{bucket, 1}); }
  // plan_config() with the shape's item capacities and query rows (valid after ReserveGraph).
  MlaPlanConfig GraphPlanConfig(GraphShape shape) const;
  MlaPlanConfig GraphPlanConfig(int bucket) const { return GraphPlanConfig(GraphShape{bucket, 1}); }
  Status UploadGraph(const AttentionBatch& batch, const MlaPlan& plan, GraphShape shape,
                     void* stream);
  Status UploadGraph(const AttentionBatch& batch, const MlaPlan& plan, int bucket, void* stream) {
    return UploadGraph(batch, plan, GraphShape{bucket, 1}, stream);
  }

  struct LayerArgs {
    const void* q_latent = nullptr;    // bf16 [num_tokens, H, 512] (decode rows read)
    const void* q_pe = nullptr;        // bf16 [num_tokens, H, 64]
    const void* latent_new = nullptr;  // bf16 [num_tokens, 576], every row appended
    void* out_latent = nullptr;        // bf16 [num_tokens, H, 512] (decode rows written)
    void* cache = nullptr;             // [num_blocks, block_size, 576] bf16 or fp8 bytes
    float cache_scale = 1.0f;          // fp8: x = e4m3(byte) * cache_scale; bf16: ignored
    float softmax_scale = 1.0f;
  };
  // Appends latent_new at the slot mapping (quantizing for fp8), then attends; uses the last
  // uploaded plan.
  Status Run(const LayerArgs& args, void* stream);
  // Attention only (the cache already holds the new rows): for benchmarks.
  Status Attend(const LayerArgs& args, void* stream);

  const MlaDecodeShape& shape() const { return shape_; }
  // Whether items of row variant v run on the sm_90a kernel (the shape's choice on this device).
  bool uses_wgmma(int variant = kMlaNumRowVariants - 1) const;
  // Whether bf16 items of row variant v take the seesaw schedule of the sm_90a kernel.
  bool uses_seesaw(int variant = kMlaNumRowVariants - 1) const;
  // Whether an fp8 cache is multiplied on e4m3 tensor cores (the shape's choice on this device).
  bool uses_fp8_mma() const;
  // Resident CTAs per SM of each row variant on the current device, for MlaPlanConfig.
  void ctas_per_sm(int out[kMlaNumRowVariants]) const;
  // The plan configuration for this shape on the current device: SM count, resident CTAs per
  // row variant, and the largest item (32 rows over an fp8 cache whose 32-row items run on the
  // wgmma kernel: four of its CTAs per token beat two portable 64-row ones at 128 heads).
  MlaPlanConfig plan_config() const;

 private:
  // One upload area: device ints (CSR arrays, slot mapping, work and merge items) with their
  // pinned staging, partial outputs, offsets in int32 elements, and what the launches cover.
  struct Area {
    PlanArea ints;
    void* d_partial = nullptr;  // partial outputs + lse
    size_t d_partial_cap = 0;
    size_t off_q_indptr = 0, off_kv_lens = 0, off_page_indptr = 0, off_pages = 0, off_slots = 0,
           off_merge = 0;
    size_t off_items[kMlaNumRowVariants] = {0, 0, 0};
    size_t off_counts = 0;  // graph: [items of each variant..., merges]
    // Grid extents: exact counts (eager) or the bucket's capacities (graph, device_counts).
    int num_tokens = 0;
    int num_items[kMlaNumRowVariants] = {0, 0, 0};
    int num_merges = 0;
    int merge_rows = kMlaMaxRows;  // the merge grid's rows per item
    int num_partials = 0;          // partial slots the partial buffer is laid out for
    bool device_counts = false;
    ~Area();
  };

  MlaDecodeShape shape_;
  Area eager_, graph_;
  Area* active_ = &eager_;  // the last upload's
  GraphCapacity graph_cap_;
  MlaPlanConfig graph_config_;  // plan_config() at ReserveGraph
};

}  // namespace llm::cuda
