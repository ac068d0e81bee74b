#include "kernels/cuda/c8/c8_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cuda/c8/c8_kernel_args.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/fmha/fmha_launcher.h"
#include "kernels/split_kv.h"

namespace llm::cuda {

namespace {
// Chunks of at least this many KV tiles per CTA run best on the 3-stage ring (see BuildC8Plan).
constexpr double kLongChunkTiles = 16.0;
}  // namespace

C8Plan BuildC8Plan(const C8Shape& shape, const AttentionBatch& batch, const C8PlanConfig& config) {
  C8Plan plan;
  plan.decode_stages = config.decode_stages;
  const int group = shape.num_q_heads / shape.num_kv_heads;
  plan.decode_tile_tokens = group <= detail::kDecodeRows ? detail::kDecodeRows / group : 0;
  plan.prefill_tile_tokens = std::max(1, detail::kPartialRows / group);

  struct Tile {
    int q_start, q_len, kv_end, page_base;
    bool prefill;
  };
  std::vector<Tile> tiles;
  int64_t total_kv = 0;
  for (int s = 0; s < batch.num_seqs; ++s) {
    const int q0 = batch.q_indptr[s], q_len = batch.q_indptr[s + 1] - q0;
    const int kv_len = batch.kv_lens[s];
    if (q_len == 0) continue;
    const int decode_max = plan.decode_tile_tokens > 0
                               ? std::max(plan.decode_tile_tokens, config.decode_query_len)
                               : 0;
    const bool prefill = q_len > decode_max;
    const int tile_tokens = prefill ? plan.prefill_tile_tokens : plan.decode_tile_tokens;
    for (int t0 = 0; t0 < q_len; t0 += tile_tokens) {
      const int len = std::min(tile_tokens, q_len - t0);
      // Causal: the tile's last query sits at position kv_len - q_len + t0 + len - 1.
      const int kv_end = kv_len - q_len + t0 + len;
      tiles.push_back({q0 + t0, len, kv_end, batch.page_indptr[s], prefill});
      total_kv += kv_end;
    }
  }
  // Choose the KV chunk with the shared split-KV search (ChooseKvChunk, kernels/split_kv.h),
  // rating each candidate by the launch time of its decode CTAs (WaveTime: (waves - 1) average
  // CTAs plus one longest), in units of one KV tile's compute (32 KB of K and V). A CTA costs its
  // tiles plus a fixed prologue / epilogue, and a split CTA also writes a partial and joins a
  // merge; the CTA that finishes a split tile last then reads all of its chunks. A 1.3-wave grid
  // idles most SMs during its tail and a tiny batch leaves most SMs empty without a split, but past
  // a few waves the fixed costs of splitting outweigh the shorter tail, and many small chunks make
  // the final merge the long pole. The costs are fitted to `c8_attention_bench --sweep 1` (the
  // sweep's figures: docs/log/PERFORMANCE_NOTEBOOK.md, section 28).
  constexpr double kCtaCost = 0.4, kSplitCost = 1.0, kMergeCost = 0.2;  // in tiles
  const int kv_tile = shape.cache == CacheType::kBf16 ? detail::kKvTile16 : detail::kKvTile8;
  int max_kv = 0;
  for (const Tile& t : tiles) max_kv = std::max(max_kv, t.kv_end);
  // Only decode tiles are split: prefill tiles are plentiful and the merge would cost more.
  bool any_decode = false;
  for (const Tile& t : tiles) any_decode |= !t.prefill;
  struct Launch {
    int64_t ctas = 0;  // per KV head
    int64_t kv_tiles = 0;
    double total = 0, longest = 0;
  };
  auto launch_for = [&](int64_t chunk) {
    Launch l;
    for (const Tile& t : tiles) {
      if (t.prefill) continue;
      const int64_t n = NumKvChunks(t.kv_end, chunk);
      const double fixed = kCtaCost + (n > 1 ? kSplitCost : 0.0);
      // n - 1 full chunks and the rest (a chunk is a multiple of 64, a tile 64 or 128 tokens).
      const int64_t rest = t.kv_end - (n - 1) * chunk;
      const int64_t full_tiles = (chunk + kv_tile - 1) / kv_tile;
      const int64_t rest_tiles = (rest + kv_tile - 1) / kv_tile;
      const double full_cost = static_cast<double>(full_tiles) + fixed;
      const double rest_cost = static_cast<double>(rest_tiles) + fixed;
      const double merge = n > 1 ? kMergeCost * static_cast<double>(n) : 0.0;
      l.total += static_cast<double>(n - 1) * full_cost + rest_cost + merge;
      l.longest = std::max(l.longest, (n > 1 ? full_cost : rest_cost) + merge);
      l.ctas += n;
      l.kv_tiles += (n - 1) * full_tiles + rest_tiles;
    }
    return l;
  };
  // The cheapest chunk for `slots` resident CTAs; a graph bucket's grid bounds the items.
  auto choose_chunk = [&](int64_t slots) {
    auto time_of = [&](int64_t c) {
      const Launch l = launch_for(c);
      return WaveTime(l.ctas * shape.num_kv_heads, slots, l.total / std::max<int64_t>(l.ctas, 1),
                      l.longest);
    };
    auto fits = [&](int64_t c) {
      return config.max_decode_items <= 0 || launch_for(c).ctas <= config.max_decode_items;
    };
    return ChooseKvChunk(
        max_kv, std::min(config.max_splits, detail::kMaxSplits), config.min_chunk_tokens, time_of,
        [](double time, double best) { return time < best; }, fits);
  };
  auto slots_for = [&](int ctas_per_sm) {
    return static_cast<int64_t>(std::max(1, config.num_sms)) * std::max(1, ctas_per_sm);
  };
  int64_t chunk = std::max(max_kv, 1);
  if (config.force_split) {
    chunk = config.min_chunk_tokens;
  } else if (any_decode) {
    // The decode ring: a deeper cp.async ring keeps more of a CTA's tiles in flight but fits
    // fewer CTAs per SM. From `c8_attention_bench --stage-sweep 1` (command A): a grid that fits
    // one wave at one CTA per SM runs best on 4 stages when its chunks span at least 4 tiles;
    // long chunks prefer 3 stages at 2 CTAs per SM, short ones 2 stages at 3. Without
    // occupancies (or with a forced depth) the plan is for config.ctas_per_sm.
    const int* occ = config.ring_ctas_per_sm;
    auto tiles_per_cta = [](const Launch& l) {
      return static_cast<double>(l.kv_tiles) / std::max<int64_t>(l.ctas, 1);
    };
    const bool pick_ring = config.decode_stages == 0;
    int stages = 0;
    if (pick_ring && occ[4] > 0) {
      const int64_t c = choose_chunk(slots_for(occ[4]));
      const Launch l = launch_for(c);
      if (l.ctas * shape.num_kv_heads <= slots_for(occ[4]) && tiles_per_cta(l) >= 4.0) {
        stages = 4;
        chunk = c;
      }
    }
    if (pick_ring && stages == 0 && occ[3] > 0) {
      const int64_t c = choose_chunk(slots_for(occ[3]));
      if (tiles_per_cta(launch_for(c)) >= kLongChunkTiles || occ[2] == 0) {
        stages = 3;
        chunk = c;
      }
    }
    if (pick_ring && stages == 0 && occ[2] > 0) {
      stages = 2;
      chunk = choose_chunk(slots_for(occ[2]));
    }
    if (stages == 0) {
      chunk = choose_chunk(slots_for(config.ctas_per_sm));
    } else {
      plan.decode_stages = stages;
    }
  }
  // The merging CTA holds one weight per chunk: never more than kMaxSplits chunks per tile.
  chunk = std::max<int64_t>(chunk, (max_kv + detail::kMaxSplits - 1) / detail::kMaxSplits);
  chunk = (chunk + 63) / 64 * 64;
  for (const Tile& t : tiles) {
    if (!t.prefill) plan.decode_rows = std::max(plan.decode_rows, t.q_len * group);
    auto& items = t.prefill ? plan.prefill_items : plan.decode_items;
    const int q_pos0 = t.kv_end - t.q_len;  // the tile's last query sits at kv_end - 1
    if (t.kv_end <= chunk || (t.prefill && !config.force_split)) {
      items.push_back({t.q_start, t.q_len, 0, t.kv_end, -1, -1, t.page_base, q_pos0});
      continue;
    }
    const int n = static_cast<int>(NumKvChunks(t.kv_end, chunk));
    const int merge = static_cast<int>(plan.merges.size());
    plan.merges.push_back({t.q_start, t.q_len, plan.num_partials, n});
    for (int c = 0; c < n; ++c) {
      const int b = static_cast<int>(c * chunk);
      const int e = static_cast<int>(std::min<int64_t>(t.kv_end, b + chunk));
      items.push_back({t.q_start, t.q_len, b, e, plan.num_partials++, merge, t.page_base, q_pos0});
    }
  }
  return plan;
}

C8Attention::C8Attention(const C8Shape& shape) : shape_(shape) {}

int C8Attention::decode_ctas_per_sm(int stages) const {
  switch (shape_.cache) {
    case CacheType::kBf16:
      return detail::DecodeCtasPerSmBf16(shape_.head_dim, stages);
    case CacheType::kInt8:
      return detail::DecodeCtasPerSmInt8(shape_.head_dim, stages);
    case CacheType::kFp8E4M3:
      return detail::DecodeCtasPerSmFp8(shape_.head_dim, stages);
  }
  return 1;
}

C8PlanConfig C8Attention::plan_config() const {
  C8PlanConfig c;
  c.num_sms = std::max(1, CudaNumSms());
  c.ctas_per_sm = std::max(1, decode_ctas_per_sm());
  for (int st = 2; st <= kC8MaxDecodeStages; ++st) c.ring_ctas_per_sm[st] = decode_ctas_per_sm(st);
  return c;
}

C8Attention::Area::~Area() {
  if (d_partial) cudaFree(d_partial);
  if (d_counters) cudaFree(d_counters);
}

C8Attention::~C8Attention() {
  if (fmha_kv_) cudaFree(fmha_kv_);
  if (fmha_workspace_) cudaFree(fmha_workspace_);
}

namespace {
// The smallest l with 2^l >= n (n a power of two: its log2).
int CeilLog2(int n) {
  int l = 0;
  while ((1 << l) < n) ++l;
  return l;
}
}  // namespace

Status C8Attention::Upload(const AttentionBatch& batch, const C8Plan& plan, void* stream) {
  static_assert(sizeof(C8WorkItem) % 4 == 0 && sizeof(C8MergeItem) % 4 == 0);
  Area& a = eager_;
  a.num_tokens = batch.num_tokens;
  a.num_decode = static_cast<int>(plan.decode_items.size());
  a.num_prefill = static_cast<int>(plan.prefill_items.size());
  a.num_partials = plan.num_partials;
  a.decode_stages = plan.decode_stages;
  a.decode_rows = plan.decode_rows;
  a.device_counts = false;
  // Layout of the one upload.
  IntLayout layout;
  a.off_counts = layout.Take(0);
  a.off_pages = layout.Take(batch.page_indices.size());
  a.off_slots = layout.Take(batch.slot_mapping.size());
  a.off_decode = layout.Take(plan.decode_items.size() * sizeof(C8WorkItem) / 4);
  a.off_prefill = layout.Take(plan.prefill_items.size() * sizeof(C8WorkItem) / 4);
  a.off_merge = layout.Take(plan.merges.size() * sizeof(C8MergeItem) / 4);
  const std::vector<int32_t> fmha = PlanFmhaPrefill(batch, plan);
  a.off_fmha = layout.Take(fmha.size());
  const size_t bytes = layout.bytes();
  LLM_ASSIGN_OR_RETURN(auto h, a.ints.Stage(bytes));
  auto put = [&](size_t o, const void* src, size_t n_bytes) {
    if (n_bytes) std::memcpy(h + o, src, n_bytes);
  };
  put(a.off_pages, batch.page_indices.data(), batch.page_indices.size() * 4);
  put(a.off_slots, batch.slot_mapping.data(), batch.slot_mapping.size() * 4);
  put(a.off_decode, plan.decode_items.data(), plan.decode_items.size() * sizeof(C8WorkItem));
  put(a.off_prefill, plan.prefill_items.data(), plan.prefill_items.size() * sizeof(C8WorkItem));
  put(a.off_merge, plan.merges.data(), plan.merges.size() * sizeof(C8MergeItem));
  put(a.off_fmha, fmha.data(), fmha.size() * 4);
  LLM_RETURN_IF_ERROR(a.ints.Grow(std::max<size_t>(bytes, 256)));
  LLM_RETURN_IF_ERROR(a.ints.Send(bytes, stream));
  const size_t rows =
      static_cast<size_t>(a.num_partials) * shape_.num_kv_heads * detail::kPartialRows;
  LLM_RETURN_IF_ERROR(GrowDeviceBuffer(&a.d_partial, &a.d_partial_cap,
                                       std::max<size_t>(rows * (shape_.head_dim + 1) * 4, 256)));
  LLM_RETURN_IF_ERROR(EnsureCounters(&a, static_cast<int>(plan.merges.size()), stream));
  active_ = &eager_;
  return Status::Ok();
}

Status C8Attention::EnsureCounters(Area* a, int merges, void* stream) {
  const size_t bytes = static_cast<size_t>(std::max(merges, 1)) * shape_.num_kv_heads * sizeof(int);
  if (bytes <= a->d_counters_cap) return Status::Ok();
  void* p = a->d_counters;
  LLM_RETURN_IF_ERROR(GrowDeviceBuffer(&p, &a->d_counters_cap, bytes));
  a->d_counters = static_cast<int*>(p);
  GPU_RETURN_IF_ERROR(
      cudaMemsetAsync(a->d_counters, 0, a->d_counters_cap, static_cast<cudaStream_t>(stream)));
  // Without a stream (ReserveGraph, at start-up) the zeros must land before any later stream's
  // kernels: non-blocking streams do not wait for the legacy stream.
  if (stream == nullptr) GPU_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return Status::Ok();
}

int C8Attention::DecodeTilesPerSeq(int q) const {
  const int group = shape_.num_q_heads / std::max(1, shape_.num_kv_heads);
  const int tile_tokens = std::max(1, detail::kDecodeRows / std::max(1, group));
  return (q + tile_tokens - 1) / tile_tokens;
}

int C8Attention::GraphItemCapacity(GraphShape shape) const {
  // Splitting helps only while the decode CTAs do not fill the GPU's resident slots, so a plan
  // never needs more than about two slots' worth of items, or one per tile.
  const int per_head = (graph_slots_ + shape_.num_kv_heads - 1) / shape_.num_kv_heads;
  return std::max(shape.seqs * DecodeTilesPerSeq(shape.q), 2 * per_head);
}

Status C8Attention::ReserveGraph(int max_seqs, int max_pages, int max_q) {
  Area& a = graph_;
  bool covered = false;
  LLM_RETURN_IF_ERROR(graph_cap_.CheckReserve(max_seqs, max_pages, max_q, a.ints, "C8", &covered));
  if (covered) return Status::Ok();
  if (max_seqs <= 0 || max_q <= 0) {
    return InvalidArgument("C8 graph area needs max_seqs and max_q > 0");
  }
  // The most CTAs per SM any ring plan may count on.
  const C8PlanConfig pc = plan_config();
  graph_slots_ = pc.num_sms * std::max({pc.ctas_per_sm, pc.ring_ctas_per_sm[2],
                                        pc.ring_ctas_per_sm[3], pc.ring_ctas_per_sm[4]});
  const int S = max_seqs, items = GraphItemCapacity(GraphShape{S, max_q});
  const int tiles = S * DecodeTilesPerSeq(max_q);  // one merge at most per tile
  IntLayout layout;
  a.off_counts = layout.Take(4);  // [decode items]
  a.off_slots = layout.Take(static_cast<size_t>(S) * max_q);
  a.off_decode = layout.Take(static_cast<size_t>(items) * sizeof(C8WorkItem) / 4);
  a.off_prefill = layout.Take(0);
  a.off_merge = layout.Take(static_cast<size_t>(tiles) * sizeof(C8MergeItem) / 4);
  a.off_pages = layout.Take(max_pages);  // last: a step copies only the entries it uses
  a.num_partials = items;                // every item at most one partial slot
  LLM_RETURN_IF_ERROR(a.ints.Grow(layout.bytes()));
  const size_t rows = static_cast<size_t>(items) * shape_.num_kv_heads * detail::kPartialRows;
  LLM_RETURN_IF_ERROR(
      GrowDeviceBuffer(&a.d_partial, &a.d_partial_cap, rows * (shape_.head_dim + 1) * 4));
  LLM_RETURN_IF_ERROR(EnsureCounters(&a, tiles, nullptr));
  a.device_counts = true;
  graph_cap_ = {S, max_pages, max_q};
  return Status::Ok();
}

Status C8Attention::UploadGraph(const AttentionBatch& batch, const C8Plan& plan, GraphShape shape,
                                void* stream) {
  Area& a = graph_;
  LLM_RETURN_IF_ERROR(graph_cap_.CheckStep(batch, shape, "C8"));
  const int tiles = shape.seqs * DecodeTilesPerSeq(shape.q);
  if (!plan.prefill_items.empty() ||
      static_cast<int>(plan.decode_items.size()) > GraphItemCapacity(shape) ||
      static_cast<int>(plan.merges.size()) > tiles || plan.num_partials > a.num_partials) {
    return InvalidArgument("graph upload: the plan does not fit the graph shape's capacities");
  }
  const size_t bytes = (a.off_pages + batch.page_indices.size()) * 4;
  LLM_ASSIGN_OR_RETURN(auto h, a.ints.Stage(bytes));
  h[a.off_counts] = static_cast<int32_t>(plan.decode_items.size());
  std::memcpy(h + a.off_pages, batch.page_indices.data(), batch.page_indices.size() * 4);
  const int tokens = batch.num_tokens;
  std::memcpy(h + a.off_slots, batch.slot_mapping.data(), tokens * 4);
  std::fill(h + a.off_slots + tokens, h + a.off_slots + shape.rows(), -1);  // padding: no append
  std::memcpy(h + a.off_decode, plan.decode_items.data(),
              plan.decode_items.size() * sizeof(C8WorkItem));
  std::memcpy(h + a.off_merge, plan.merges.data(), plan.merges.size() * sizeof(C8MergeItem));
  LLM_RETURN_IF_ERROR(a.ints.Send(bytes, stream));
  a.num_tokens = shape.rows();
  a.decode_stages = plan.decode_stages;  // a captured launch keeps its ring: either is correct
  // Every step of a shape has q query tokens per sequence, in tiles of at most the decode tile's
  // tokens: a captured launch's row count fits every replay.
  const int group = shape_.num_q_heads / shape_.num_kv_heads;
  const int tile_tokens = std::max(1, detail::kDecodeRows / std::max(1, group));
  a.decode_rows = std::min(shape.q, tile_tokens) * group;
  a.num_decode = GraphItemCapacity(shape);
  a.num_prefill = 0;
  a.fmha = false;
  active_ = &graph_;
  return Status::Ok();
}

Status C8Attention::Run(const LayerArgs& args, void* stream) {
  const Area& a = *active_;
  const auto* ints = a.ints.device();
  detail::AppendArgs ap{args.k_new,
                        args.v_new,
                        args.k_cache,
                        args.v_cache,
                        args.k_scale,
                        args.v_scale,
                        ints + a.off_slots,
                        a.num_tokens,
                        shape_.num_kv_heads,
                        shape_.block_size,
                        static_cast<int>(shape_.scale)};
  // The append reads and writes 8-byte groups of a row.
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 8 == 0; };
  if (args.rope.qkv == nullptr) {
    if (!aligned(args.k_new) || !aligned(args.v_new)) {
      return InvalidArgument("C8 append needs 8-byte aligned k_new / v_new");
    }
    detail::LaunchAppend(ap, shape_.cache, shape_.head_dim, stream);
    GPU_RETURN_IF_ERROR(cudaGetLastError());
    return Attend(args, stream);
  }
  const FusedRope& r = args.rope;
  if (!aligned(r.qkv) || !aligned(r.q) || (r.bias != nullptr && !aligned(r.bias))) {
    return InvalidArgument("C8 append with rotary needs 8-byte aligned qkv / bias / q");
  }
  detail::RopeAppendArgs ra{ap, r, shape_.num_q_heads};
  detail::LaunchRopeAppend(ra, shape_.cache, shape_.head_dim, stream);
  GPU_RETURN_IF_ERROR(cudaGetLastError());
  LayerArgs attend = args;
  attend.q = r.q;
  return Attend(attend, stream);
}

Status C8Attention::Attend(const LayerArgs& args, void* stream) {
  const Area& a = *active_;
  const auto* ints = a.ints.device();
  float* partial_o = static_cast<float*>(a.d_partial);
  float* partial_lse = partial_o + static_cast<size_t>(a.num_partials) * shape_.num_kv_heads *
                                       detail::kPartialRows * shape_.head_dim;
  const int32_t* counts = a.device_counts ? ints + a.off_counts : nullptr;
  detail::TileArgs ta{};
  ta.q = args.q;
  ta.out = args.out;
  ta.out_fp8 = args.out_fp8;
  ta.out_inv_scale = args.out_fp8_inv_scale;
  if (args.out_fp8 != nullptr && reinterpret_cast<uintptr_t>(args.out_fp8) % 4 != 0) {
    return InvalidArgument("C8 fp8 output needs a 4-byte aligned buffer");
  }
  ta.k_cache = args.k_cache;
  ta.v_cache = args.v_cache;
  ta.k_scale = args.k_scale;
  ta.v_scale = args.v_scale;
  ta.pages = ints + a.off_pages;
  ta.device_num_items = counts;
  ta.partial_o = partial_o;
  ta.partial_lse = partial_lse;
  ta.merges = reinterpret_cast<const C8MergeItem*>(ints + a.off_merge);
  ta.merge_counters = a.d_counters;
  ta.num_q_heads = shape_.num_q_heads;
  ta.num_kv_heads = shape_.num_kv_heads;
  const int lbs = CeilLog2(shape_.block_size);
  if ((1 << lbs) != shape_.block_size) {
    return InvalidArgument("C8 attention needs a power-of-two block size, got " +
                           std::to_string(shape_.block_size));
  }
  ta.log2_block_size = lbs;
  ta.scale_mode = static_cast<int>(shape_.scale);
  ta.scale_log2 = args.softmax_scale * 1.4426950408889634f;
  ta.window = args.window_left >= 0 ? args.window_left : detail::kNoWindow;
  ta.sink_logits = args.sink_logits;
  ta.decode_stages = a.decode_stages;
  ta.decode_rows = a.decode_rows;
  auto launch = [&](const C8WorkItem* items, int n, bool prefill) {
    ta.items = items;
    ta.num_items = n;
    switch (shape_.cache) {
      case CacheType::kBf16:
        detail::LaunchTilesBf16(ta, shape_.head_dim, prefill, stream);
        break;
      case CacheType::kInt8:
        detail::LaunchTilesInt8(ta, shape_.head_dim, prefill, stream);
        break;
      case CacheType::kFp8E4M3:
        detail::LaunchTilesFp8(ta, shape_.head_dim, prefill, stream);
        break;
    }
  };
  launch(reinterpret_cast<const C8WorkItem*>(ints + a.off_decode), a.num_decode, false);
  GPU_RETURN_IF_ERROR(cudaGetLastError());
  if (a.fmha) return AttendPrefillFmha(args, stream);
  launch(reinterpret_cast<const C8WorkItem*>(ints + a.off_prefill), a.num_prefill, true);
  GPU_RETURN_IF_ERROR(cudaGetLastError());
  return Status::Ok();
}

Status C8Attention::SetPrefillFmha(bool on) {
  if (on && (shape_.cache == CacheType::kBf16 || !FmhaWgmmaAvailable())) {
    return InvalidArgument(
        "C8 prefill through FMHA needs an 8-bit cache, a compute capability 9.0 device and a "
        "build with sm_90a");
  }
  prefill_fmha_ = on;
  return Status::Ok();
}

std::vector<int32_t> C8Attention::PlanFmhaPrefill(const AttentionBatch& batch, const C8Plan& plan) {
  Area& a = eager_;
  a.fmha = false;
  if (!prefill_fmha_ || plan.prefill_items.empty()) return {};
  // The sequences the planner gave prefill tiles, which must own one contiguous run of rows.
  std::vector<int> seqs;
  int64_t keys = 0;
  for (int s = 0; s < batch.num_seqs; ++s) {
    const int q_len = batch.q_indptr[s + 1] - batch.q_indptr[s];
    if (q_len == 0 || q_len <= plan.decode_tile_tokens) continue;
    if (!seqs.empty() && batch.q_indptr[s] != batch.q_indptr[seqs.back() + 1]) return {};
    seqs.push_back(s);
    keys += batch.kv_lens[s];
  }
  const size_t row_bytes = static_cast<size_t>(shape_.num_kv_heads) * shape_.head_dim * 2;
  if (seqs.empty() || static_cast<size_t>(keys) * 2 * row_bytes > kMaxFmhaPrefillKeyBytes) {
    return {};
  }
  const int n = static_cast<int>(seqs.size());
  std::vector<int32_t> h(3 * static_cast<size_t>(n) + 2 + n);
  int32_t* seqstart_q = h.data();
  int32_t* seqlen_k = seqstart_q + n + 1;
  int32_t* seqstart_k = seqlen_k + n;
  int32_t* page_base = seqstart_k + n + 1;
  a.fmha_row0 = batch.q_indptr[seqs[0]];
  a.fmha_max_q = a.fmha_max_k = 0;
  seqstart_q[0] = seqstart_k[0] = 0;
  for (int i = 0; i < n; ++i) {
    const int s = seqs[i];
    const int q_len = batch.q_indptr[s + 1] - batch.q_indptr[s];
    seqstart_q[i + 1] = seqstart_q[i] + q_len;
    seqlen_k[i] = batch.kv_lens[s];
    seqstart_k[i + 1] = seqstart_k[i] + batch.kv_lens[s];
    page_base[i] = batch.page_indptr[s];
    a.fmha_max_q = std::max(a.fmha_max_q, q_len);
    a.fmha_max_k = std::max(a.fmha_max_k, batch.kv_lens[s]);
  }
  a.fmha_seqs = n;
  a.fmha_keys = static_cast<int>(keys);
  // Split KV only when the CTAs (sequence, KV head, 128-row tile) do not fill the SMs: a causal
  // prefill's CTAs differ in length anyway, and FmhaAutoSplits' wave count (tuned on equal-length
  // decode CTAs) split a batch of mid-length prompts in two, and the merge of those splits cost
  // far more than the split saved. Host-side fields only: no device memory is read.
  FmhaParams p = FmhaPrefillParams(a, nullptr);
  if (!FmhaCheckParams(p).ok()) return {};  // e.g. a grid past the launch limits: the tiles
  const int group = shape_.num_q_heads / shape_.num_kv_heads;
  int64_t ctas = 0;
  for (int i = 0; i < n; ++i) {
    ctas += (static_cast<int64_t>(seqstart_q[i + 1] - seqstart_q[i]) * group + 127) / 128;
  }
  ctas *= shape_.num_kv_heads;
  a.fmha_splits = ctas >= CudaNumSms() ? 1 : FmhaAutoSplits(p);
  const size_t ws = a.fmha_splits > 1 ? FmhaWorkspaceBytes(p, a.fmha_splits) : 0;
  if (!GrowDeviceBuffer(&fmha_workspace_, &fmha_workspace_cap_, std::max<size_t>(ws, 256)).ok() ||
      !GrowDeviceBuffer(&fmha_kv_, &fmha_kv_cap_, std::max<size_t>(keys * 2 * row_bytes, 256))
           .ok()) {
    (void)cudaGetLastError();  // the failed allocation must not fail a later launch check
    return {};                 // no memory for the copy: the prefill tiles need none
  }
  a.fmha = true;
  return h;
}

FmhaParams C8Attention::FmhaPrefillParams(const Area& a, const int32_t* ints) const {
  FmhaParams p;
  p.dtype = FmhaDType::kBf16;
  p.batch = a.fmha_seqs;
  p.num_q_heads = shape_.num_q_heads;
  p.num_kv_heads = shape_.num_kv_heads;
  p.head_dim = shape_.head_dim;
  p.max_seqlen_q = a.fmha_max_q;
  p.max_seqlen_k = a.fmha_max_k;
  p.block_size = 0;
  p.mask = FmhaMask{FmhaMaskType::kCausalBottomRight, -1, 0, 0};
  // Host planning needs only non-null stand-ins for the device arrays and tensors.
  static const int32_t kStandIn[1] = {0};
  const int32_t* base = ints ? ints + a.off_fmha : kStandIn;
  const int n = a.fmha_seqs;
  p.seqstart_q = base;
  p.seqlen_k = ints ? base + n + 1 : kStandIn;
  p.seqstart_k = ints ? base + 2 * n + 1 : kStandIn;
  void* stand_in = reinterpret_cast<void*>(uintptr_t{256});
  p.q = p.k = p.v = p.out = stand_in;
  return p;
}

Status C8Attention::AttendPrefillFmha(const LayerArgs& args, void* stream) {
  const Area& a = eager_;
  const auto* ints = a.ints.device();
  const size_t copy_elems =
      static_cast<size_t>(a.fmha_keys) * shape_.num_kv_heads * shape_.head_dim;
  auto* k16 = static_cast<uint16_t*>(fmha_kv_);
  uint16_t* v16 = k16 + copy_elems;
  const int n = a.fmha_seqs;
  detail::DequantArgs d{args.k_cache,
                        args.v_cache,
                        args.k_scale,
                        args.v_scale,
                        ints + a.off_pages,
                        ints + a.off_fmha + 3 * n + 2,
                        ints + a.off_fmha + 2 * n + 1,
                        k16,
                        v16,
                        n,
                        a.fmha_max_k,
                        shape_.num_kv_heads,
                        CeilLog2(shape_.block_size),
                        static_cast<int>(shape_.scale)};
  detail::LaunchDequantKv(d, shape_.cache, shape_.head_dim, stream);
  GPU_RETURN_IF_ERROR(cudaGetLastError());
  FmhaParams p = FmhaPrefillParams(a, ints);
  const size_t row0 = static_cast<size_t>(a.fmha_row0) * shape_.num_q_heads * shape_.head_dim;
  p.q = static_cast<const uint16_t*>(args.q) + row0;
  if (args.out_fp8 != nullptr) {
    p.out = nullptr;
    p.out_fp8 = static_cast<uint8_t*>(args.out_fp8) + row0;
    p.out_fp8_inv_scale = args.out_fp8_inv_scale;
  } else {
    p.out = static_cast<uint16_t*>(args.out) + row0;
  }
  p.k = k16;
  p.v = v16;
  p.softmax_scale = args.softmax_scale;
  // The layer's window and sinks; the copy holds zeros for freed blocks, which only keys left of
  // every window occupy.
  if (args.window_left >= 0) p.mask = FmhaMask{FmhaMaskType::kWindow, args.window_left, 0, 0};
  p.sink_logits = args.sink_logits;
  FmhaLaunchOptions opt;
  opt.num_splits = a.fmha_splits;
  opt.workspace = fmha_workspace_;
  opt.workspace_bytes = fmha_workspace_cap_;
  opt.kernel = FmhaKernel::kWgmma;
  return FmhaForward(p, opt, stream);
}

}  // namespace llm::cuda
