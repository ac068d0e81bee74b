// Device-side argument structs shared by the C8 kernels and their launchers (internal).
#pragma once

#include <cstdint>

#include "kernels/cuda/c8/c8_attention.h"
#include "kernels/cuda/c8/c8_window.h"

namespace llm::cuda::detail {

struct TileArgs {
  const void* q;  // bf16 [T, Hq, D]
  void* out;      // bf16 [T, Hq, D], unless out_fp8 is set
  // Set: the output is written here instead, as e4m3 bytes [T, Hq, D] of out * out_inv_scale
  // (o_proj's fp8 input with a static scale, C8Attention::LayerArgs::out_fp8).
  void* out_fp8;
  float out_inv_scale;
  const void* k_cache;
  const void* v_cache;
  const float* k_scale;
  const float* v_scale;
  const int32_t* pages;  // block table (C8WorkItem::page_base indexes it)
  const C8WorkItem* items;
  float* partial_o;    // [num_partials, Hkv, kPartialRows, D]
  float* partial_lse;  // [num_partials, Hkv, kPartialRows] (log2 domain)
  const C8MergeItem* merges;
  int* merge_counters;  // [merges, Hkv], zero between launches
  // Graph launches: the grid covers a capacity and the step's item count is read here (CTAs past
  // it exit). Null: num_items is exact.
  const int32_t* device_num_items;
  int num_items;
  int num_q_heads;
  int num_kv_heads;
  int log2_block_size;
  int scale_mode;    // ScaleMode
  float scale_log2;  // softmax_scale * log2(e)
  // Sliding window: a query at position p sees keys [p - window, p]; kNoWindow (INT_MAX) when the
  // layer has none, so the masks need no branch on it.
  int window;
  // [num_q_heads] learned sink logits (natural-log units: one more softmax column with a zero
  // value vector, AttentionParams::sink_logits), or null.
  const float* sink_logits;
  int decode_stages;  // decode cp.async ring depth (C8Plan::decode_stages; 0: the cache's default)
  int decode_rows;    // most query rows of a decode tile (C8Plan::decode_rows; 0: up to 16)
};

struct AppendArgs {
  const void* k_new;  // bf16 [T, Hkv, D]
  const void* v_new;
  void* k_cache;
  void* v_cache;
  float* k_scale;
  float* v_scale;
  const int32_t* slots;  // -1: padding row of a graph bucket, not written
  int num_tokens;
  int num_kv_heads;
  int block_size;
  int scale_mode;
};

// The append with the rotary fused in: `cache` gives the destination (its k_new / v_new unused),
// `rope` the raw projection (FusedRope).
struct RopeAppendArgs {
  AppendArgs cache;
  FusedRope rope;
  int num_q_heads;
};

// The prefill sequences' cached K/V as packed bf16 rows for the FMHA prefill path
// (C8Attention::SetPrefillFmha): sequence s's key j becomes row seqstart_k[s] + j of k_out / v_out.
struct DequantArgs {
  const void* k_cache;  // 8-bit [num_blocks, Hkv, block_size, D]
  const void* v_cache;
  const float* k_scale;  // ScaleMode layout
  const float* v_scale;
  const int32_t* pages;       // block table
  const int32_t* page_base;   // [num_seqs] each sequence's first block-table entry
  const int32_t* seqstart_k;  // [num_seqs + 1]
  void* k_out;                // bf16 [seqstart_k[num_seqs], Hkv, D]
  void* v_out;
  int num_seqs;
  int max_kv;  // the longest sequence's keys (grid)
  int num_kv_heads;
  int log2_block_size;
  int scale_mode;
};

constexpr int kNoWindow = kC8NoWindow;  // TileArgs::window without a sliding window
constexpr int kPartialRows = 128;       // rows of the largest (prefill) tile
constexpr int kDecodeRows = 16;         // decode tile: query tokens x GQA group <= 16
constexpr int kMaxSplits = 64;          // KV chunks of one query tile (the fused merge's weights)
// KV tokens per shared-memory stage of the tile kernel (32 KB of K and V either way); the planner
// prices CTAs in these tiles.
constexpr int kKvTile16 = 64;                         // bf16 cache
constexpr int kKvTile8 = 128;                         // int8 / fp8 cache
constexpr int kMaxDecodeStages = kC8MaxDecodeStages;  // deepest decode ring instantiated

// Launchers, one translation unit per cache type (explicit instantiation groups).
void LaunchTilesBf16(const TileArgs& a, int head_dim, bool prefill, void* stream);
void LaunchTilesInt8(const TileArgs& a, int head_dim, bool prefill, void* stream);
void LaunchTilesFp8(const TileArgs& a, int head_dim, bool prefill, void* stream);
// Resident decode CTAs per SM for a cache type and ring depth (C8Attention::decode_ctas_per_sm).
int DecodeCtasPerSmBf16(int head_dim, int stages);
int DecodeCtasPerSmInt8(int head_dim, int stages);
int DecodeCtasPerSmFp8(int head_dim, int stages);
void LaunchAppend(const AppendArgs& a, CacheType cache, int head_dim, void* stream);
void LaunchRopeAppend(const RopeAppendArgs& a, CacheType cache, int head_dim, void* stream);
void LaunchDequantKv(const DequantArgs& a, CacheType cache, int head_dim, void* stream);

}  // namespace llm::cuda::detail
