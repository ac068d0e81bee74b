#include "kernels/cuda/mla/mla_decode.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_info.h"
#include "kernels/cuda/mla/mla_kernel_args.h"
#include "kernels/split_kv.h"

namespace llm::cuda {

MlaPlan BuildMlaPlan(const MlaDecodeShape& shape, const AttentionBatch& batch,
                     const MlaPlanConfig& config) {
  MlaPlan plan;
  const int H = shape.num_heads;
  if (H <= 0) return plan;
  const int max_rows = std::clamp(config.max_item_rows, kMlaVariantRows[0], kMlaMaxRows);
  const int heads_per_item = std::min(H, max_rows);
  const int tokens_per_item = std::max(1, max_rows / heads_per_item);

  struct Tile {
    int seq, q_start, q_len, head_start, num_heads, kv_end, variant;
  };
  std::vector<Tile> tiles;
  for (int s = 0; s < batch.num_seqs; ++s) {
    const int q0 = batch.q_indptr[s], q_len = batch.q_indptr[s + 1] - q0;
    if (q_len < 1 || q_len > config.max_decode_query_len) continue;  // prefill: the caller's
    const int kv_len = batch.kv_lens[s];
    for (int t0 = 0; t0 < q_len; t0 += tokens_per_item) {
      const int nt = std::min(tokens_per_item, q_len - t0);
      // Causal: the item's last query token sits at position kv_len - q_len + t0 + nt - 1.
      const int kv_end = std::max(0, kv_len - q_len + t0 + nt);
      for (int h0 = 0; h0 < H; h0 += heads_per_item) {
        const int nh = std::min(heads_per_item, H - h0);
        const int rows = nt * nh;
        int v = 0;
        while (kMlaVariantRows[v] < rows) ++v;
        tiles.push_back({s, q0 + t0, nt, h0, nh, kv_end, v});
      }
    }
  }

  // KV chunk: fill the resident CTA slots in full waves. A small batch leaves most SMs idle
  // without a split; a grid of 1.3 waves idles most of them in its tail.
  int max_kv = 0;
  for (const Tile& t : tiles) max_kv = std::max(max_kv, t.kv_end);
  auto waves_for = [&](int64_t chunk) {
    double w = 0;
    for (const Tile& t : tiles) {
      const int64_t ctas = std::max<int64_t>(1, NumKvChunks(t.kv_end, chunk));
      w += static_cast<double>(ctas) /
           (std::max(1, config.num_sms) * std::max(1, config.ctas_per_sm[t.variant]));
    }
    return w;
  };
  // A graph bucket's grid bounds the items of each row variant (config.max_items).
  auto fits = [&](int64_t chunk) {
    int64_t n[kMlaNumRowVariants] = {0, 0, 0};
    for (const Tile& t : tiles) n[t.variant] += std::max<int64_t>(1, NumKvChunks(t.kv_end, chunk));
    for (int v = 0; v < kMlaNumRowVariants; ++v) {
      if (config.max_items[v] > 0 && n[v] > config.max_items[v]) return false;
    }
    return true;
  };
  const int min_chunk = std::max(64, (config.min_chunk_tokens + 63) / 64 * 64);
  int64_t chunk = std::max(max_kv, 1);
  if (config.force_split) {
    chunk = min_chunk;
  } else if (!tiles.empty()) {
    chunk = ChooseKvChunk(
        max_kv, config.max_splits, min_chunk, waves_for,
        [](double waves, double best_waves) {
          return SplitImproves(waves, WaveEfficiency(waves), WaveEfficiency(best_waves));
        },
        fits);
  }
  chunk = (chunk + 63) / 64 * 64;
  for (const Tile& t : tiles) {
    auto& items = plan.items[t.variant];
    if (t.kv_end <= chunk) {
      items.push_back({t.seq, t.q_start, t.q_len, t.head_start, t.num_heads, 0, t.kv_end, -1});
      continue;
    }
    const int n = static_cast<int>(NumKvChunks(t.kv_end, chunk));
    plan.merges.push_back({t.q_start, t.q_len, t.head_start, t.num_heads, plan.num_partials, n});
    for (int c = 0; c < n; ++c) {
      const int b = static_cast<int>(c * chunk);
      const int e = static_cast<int>(std::min<int64_t>(t.kv_end, b + chunk));
      items.push_back(
          {t.seq, t.q_start, t.q_len, t.head_start, t.num_heads, b, e, plan.num_partials++});
    }
  }
  return plan;
}

bool MlaWgmmaAvailable() {
#if LLM_MLA_WGMMA
  return CurrentDeviceIsSm90();
#else
  return false;
#endif
}

MlaDecode::MlaDecode(const MlaDecodeShape& shape) : shape_(shape) {}

bool MlaFp8MmaAvailable() {
  return mla::AttendFp8MmaAvailable();
}

bool MlaDecode::uses_fp8_mma() const {
  if (shape_.cache != MlaCacheType::kFp8E4M3 || shape_.fp8_math == MlaFp8Math::kF16) return false;
  // Hopper's mma.sync m16n8k32 e4m3 takes about twice as long as an f16 m16n8k16 (no fp8 gain),
  // so the hi/lo split doubles the tensor time and kAuto keeps the f16 kernel there; Ada and
  // consumer Blackwell (sm_89, sm_120) run fp8 mma.sync at twice the f16 rate.
  if (shape_.fp8_math == MlaFp8Math::kAuto && CurrentDeviceIsSm90()) return false;
  return MlaFp8MmaAvailable();
}

bool MlaDecode::uses_wgmma(int variant) const {
  if (shape_.kernel == MlaKernel::kPortable) return false;
  if (shape_.cache == MlaCacheType::kFp8E4M3) {
    // fp8: 16- and 32-row items on the transposed e4m3 wgmma kernel (mla_decode_fp8_wgmma.cu,
    // faster than the portable one on every measured shape); 64-row items (its O^T would not fit
    // in registers) stay portable.
    return kMlaVariantRows[variant] <= 32 && MlaWgmmaAvailable();
  }
  return MlaWgmmaAvailable();
}

bool MlaDecode::uses_seesaw(int variant) const {
  if (shape_.cache != MlaCacheType::kBf16 || !uses_wgmma(variant)) return false;
  if (shape_.bf16_schedule == MlaBf16Schedule::kRing) return false;
  if (shape_.block_size % 64 != 0) return false;  // kSeesaw here is refused by CheckKernelChoice
  // kAuto: 64-row items only. Padded 16- and 32-row items are memory-bound, and there the ring's
  // producer keeps more copies in flight.
  return shape_.bf16_schedule == MlaBf16Schedule::kSeesaw || variant == kMlaNumRowVariants - 1;
}

namespace {
Status CheckKernelChoice(const MlaDecodeShape& shape) {
  if (shape.bf16_schedule == MlaBf16Schedule::kSeesaw && shape.block_size % 64 != 0) {
    return InvalidArgument(
        "MLA decode: the seesaw schedule needs a block size that is a multiple "
        "of 64, got " +
        std::to_string(shape.block_size));
  }
  if (shape.cache == MlaCacheType::kFp8E4M3 && shape.fp8_math == MlaFp8Math::kE4m3 &&
      !MlaFp8MmaAvailable()) {
    return InvalidArgument(
        "MLA decode: e4m3 MMA over the fp8 cache needs a device whose kernel binary is sm_89 or "
        "later");
  }
  if (shape.kernel != MlaKernel::kWgmma) return Status::Ok();
  if (!MlaWgmmaAvailable()) {
    return InvalidArgument(
        "MLA decode: the wgmma kernel needs a compute capability 9.0 device and a build that "
        "includes sm_90a");
  }
  return Status::Ok();
}
}  // namespace

MlaDecode::Area::~Area() {
  if (d_partial) cudaFree(d_partial);
}

MlaDecode::~MlaDecode() = default;

void MlaDecode::ctas_per_sm(int out[kMlaNumRowVariants]) const {
  for (int v = 0; v < kMlaNumRowVariants; ++v) {
    out[v] = shape_.cache == MlaCacheType::kBf16
                 ? mla::AttendCtasPerSmBf16(kMlaVariantRows[v])
                 : mla::AttendCtasPerSmFp8(kMlaVariantRows[v], uses_fp8_mma());
  }
#if LLM_MLA_WGMMA
  for (int v = 0; v < kMlaNumRowVariants; ++v) {
    if (uses_wgmma(v)) {
      out[v] = shape_.cache == MlaCacheType::kFp8E4M3
                   ? mla::AttendCtasPerSmFp8Wgmma(kMlaVariantRows[v])
               : uses_seesaw(v) ? mla::AttendCtasPerSmBf16Seesaw()
                                : mla::AttendCtasPerSmBf16Wgmma();
    }
  }
#endif
}

MlaPlanConfig MlaDecode::plan_config() const {
  MlaPlanConfig c;
  c.num_sms = CudaNumSms();
  ctas_per_sm(c.ctas_per_sm);
  if (shape_.cache == MlaCacheType::kFp8E4M3 && uses_wgmma(1)) c.max_item_rows = 32;
  return c;
}

Status MlaDecode::Upload(const AttentionBatch& batch, const MlaPlan& plan, void* stream) {
  static_assert(sizeof(MlaWorkItem) % 16 == 0 && sizeof(MlaMergeItem) % 4 == 0);
  if (shape_.num_heads <= 0 || shape_.block_size <= 0) {
    return InvalidArgument("MLA decode needs num_heads > 0 and block_size > 0");
  }
  LLM_RETURN_IF_ERROR(CheckKernelChoice(shape_));
  Area& a = eager_;
  a.num_tokens = batch.num_tokens;
  for (int v = 0; v < kMlaNumRowVariants; ++v) {
    a.num_items[v] = static_cast<int>(plan.items[v].size());
  }
  a.num_merges = static_cast<int>(plan.merges.size());
  a.merge_rows = kMlaMaxRows;
  a.num_partials = plan.num_partials;
  a.device_counts = false;
  // Layout of the one upload.
  IntLayout layout;
  a.off_q_indptr = layout.Take(batch.q_indptr.size());
  a.off_kv_lens = layout.Take(batch.kv_lens.size());
  a.off_page_indptr = layout.Take(batch.page_indptr.size());
  a.off_pages = layout.Take(batch.page_indices.size());
  a.off_slots = layout.Take(batch.slot_mapping.size());
  for (int v = 0; v < kMlaNumRowVariants; ++v) {
    a.off_items[v] = layout.Take(plan.items[v].size() * sizeof(MlaWorkItem) / 4);
  }
  a.off_merge = layout.Take(plan.merges.size() * sizeof(MlaMergeItem) / 4);
  const size_t bytes = layout.bytes();
  LLM_ASSIGN_OR_RETURN(auto h, a.ints.Stage(bytes));
  auto put = [&](size_t o, const void* src, size_t n_bytes) {
    if (n_bytes) std::memcpy(h + o, src, n_bytes);
  };
  put(a.off_q_indptr, batch.q_indptr.data(), batch.q_indptr.size() * 4);
  put(a.off_kv_lens, batch.kv_lens.data(), batch.kv_lens.size() * 4);
  put(a.off_page_indptr, batch.page_indptr.data(), batch.page_indptr.size() * 4);
  put(a.off_pages, batch.page_indices.data(), batch.page_indices.size() * 4);
  put(a.off_slots, batch.slot_mapping.data(), batch.slot_mapping.size() * 4);
  for (int v = 0; v < kMlaNumRowVariants; ++v) {
    put(a.off_items[v], plan.items[v].data(), plan.items[v].size() * sizeof(MlaWorkItem));
  }
  put(a.off_merge, plan.merges.data(), plan.merges.size() * sizeof(MlaMergeItem));
  LLM_RETURN_IF_ERROR(a.ints.Grow(std::max<size_t>(bytes, 256)));
  LLM_RETURN_IF_ERROR(a.ints.Send(bytes, stream));
  const size_t rows = static_cast<size_t>(a.num_partials) * kMlaMaxRows;
  LLM_RETURN_IF_ERROR(GrowDeviceBuffer(&a.d_partial, &a.d_partial_cap,
                                       std::max<size_t>(rows * (kMlaLatentDim + 1) * 4, 256)));
  active_ = &eager_;
  return Status::Ok();
}

namespace {
// Work items of each row variant for one sequence of q query tokens (BuildMlaPlan's split of its
// rows into items: heads first, then tokens).
void TilesPerSeq(int num_heads, int max_item_rows, int q, int out[kMlaNumRowVariants]) {
  const int max_rows = std::clamp(max_item_rows, kMlaVariantRows[0], kMlaMaxRows);
  const int heads_per_item = std::min(num_heads, max_rows);
  const int tokens_per_item = std::max(1, max_rows / std::max(1, heads_per_item));
  for (int v = 0; v < kMlaNumRowVariants; ++v) out[v] = 0;
  for (int t0 = 0; t0 < q; t0 += tokens_per_item) {
    const int nt = std::min(tokens_per_item, q - t0);
    for (int h0 = 0; h0 < num_heads; h0 += heads_per_item) {
      const int rows = nt * std::min(heads_per_item, num_heads - h0);
      int v = 0;
      while (kMlaVariantRows[v] < rows) ++v;
      ++out[v];
    }
  }
}
}  // namespace

int MlaDecode::GraphItemCapacity(GraphShape shape, int variant) const {
  int per_seq[kMlaNumRowVariants];
  TilesPerSeq(shape_.num_heads, graph_config_.max_item_rows, shape.q, per_seq);
  const int tiles = shape.seqs * per_seq[variant];
  if (tiles == 0) return 0;
  // Splitting pays only while the items do not fill the GPU's resident CTA slots, so a plan
  // rarely wants more than two slots' worth (the planner is held to it), or one per tile.
  const int slots =
      std::max(1, graph_config_.num_sms) * std::max(1, graph_config_.ctas_per_sm[variant]);
  return std::max(tiles, 2 * slots);
}

int MlaDecode::GraphMergeCapacity(GraphShape shape) const {
  int per_seq[kMlaNumRowVariants];
  TilesPerSeq(shape_.num_heads, graph_config_.max_item_rows, shape.q, per_seq);
  return shape.seqs * (per_seq[0] + per_seq[1] + per_seq[2]);
}

MlaPlanConfig MlaDecode::GraphPlanConfig(GraphShape shape) const {
  MlaPlanConfig c = graph_config_;
  c.max_decode_query_len = std::max(shape.q, kMlaMaxDecodeQueryLen);
  for (int v = 0; v < kMlaNumRowVariants; ++v) {
    // A variant the shape never plans keeps a bound of one (zero would mean none).
    c.max_items[v] = std::max(1, GraphItemCapacity(shape, v));
  }
  return c;
}

Status MlaDecode::ReserveGraph(int max_seqs, int max_pages, int max_q) {
  Area& a = graph_;
  bool covered = false;
  LLM_RETURN_IF_ERROR(graph_cap_.CheckReserve(max_seqs, max_pages, max_q, a.ints, "MLA", &covered));
  if (covered) return Status::Ok();
  if (shape_.num_heads <= 0 || shape_.block_size <= 0 || max_seqs <= 0 || max_pages < 0 ||
      max_q <= 0) {
    return InvalidArgument("MLA graph area needs num_heads, block_size, max_seqs and max_q > 0");
  }
  LLM_RETURN_IF_ERROR(CheckKernelChoice(shape_));
  graph_config_ = plan_config();
  const int S = max_seqs;
  IntLayout layout;
  a.off_counts = layout.Take(kMlaNumRowVariants + 1);
  a.off_q_indptr = layout.Take(S + 1);
  a.off_kv_lens = layout.Take(S);
  a.off_page_indptr = layout.Take(S + 1);
  a.off_slots = layout.Take(static_cast<size_t>(S) * max_q);
  // Each variant's items and the merges: the most any shape of up to max_q rows plans (a larger
  // q moves a sequence's rows into larger items, so no one q bounds every variant).
  int partials = 0, merges = 0;
  for (int v = 0; v < kMlaNumRowVariants; ++v) {
    int cap = 0;
    for (int q = 1; q <= max_q; ++q) cap = std::max(cap, GraphItemCapacity(GraphShape{S, q}, v));
    a.off_items[v] = layout.Take(static_cast<size_t>(cap) * sizeof(MlaWorkItem) / 4);
    partials += cap;  // every item at most one partial slot
  }
  for (int q = 1; q <= max_q; ++q) merges = std::max(merges, GraphMergeCapacity(GraphShape{S, q}));
  a.off_merge = layout.Take(static_cast<size_t>(merges) * sizeof(MlaMergeItem) / 4);
  a.off_pages = layout.Take(max_pages);  // last: a step copies only the entries it uses
  a.num_partials = partials;
  a.device_counts = true;
  LLM_RETURN_IF_ERROR(a.ints.Grow(layout.bytes()));
  const size_t rows = static_cast<size_t>(partials) * kMlaMaxRows;
  LLM_RETURN_IF_ERROR(
      GrowDeviceBuffer(&a.d_partial, &a.d_partial_cap, rows * (kMlaLatentDim + 1) * 4));
  graph_cap_ = {S, max_pages, max_q};
  return Status::Ok();
}

Status MlaDecode::UploadGraph(const AttentionBatch& batch, const MlaPlan& plan, GraphShape shape,
                              void* stream) {
  Area& a = graph_;
  const int n = batch.num_seqs;
  LLM_RETURN_IF_ERROR(graph_cap_.CheckStep(batch, shape, "MLA"));
  for (int v = 0; v < kMlaNumRowVariants; ++v) {
    const int cap = GraphItemCapacity(shape, v);
    if (static_cast<int>(plan.items[v].size()) > cap) {
      return InvalidArgument("MLA graph upload: " + std::to_string(plan.items[v].size()) + " " +
                             std::to_string(kMlaVariantRows[v]) + "-row items, the shape's grid " +
                             std::to_string(cap));
    }
  }
  if (static_cast<int>(plan.merges.size()) > GraphMergeCapacity(shape) ||
      plan.num_partials > a.num_partials) {
    return InvalidArgument("MLA graph upload: the plan's merges do not fit the shape");
  }
  const size_t bytes = (a.off_pages + batch.page_indices.size()) * 4;
  LLM_ASSIGN_OR_RETURN(auto h, a.ints.Stage(bytes));
  for (int v = 0; v < kMlaNumRowVariants; ++v) {
    h[a.off_counts + v] = static_cast<int32_t>(plan.items[v].size());
  }
  h[a.off_counts + kMlaNumRowVariants] = static_cast<int32_t>(plan.merges.size());
  std::memcpy(h + a.off_q_indptr, batch.q_indptr.data(), (n + 1) * 4);
  std::memcpy(h + a.off_kv_lens, batch.kv_lens.data(), n * 4);
  std::memcpy(h + a.off_page_indptr, batch.page_indptr.data(), (n + 1) * 4);
  const int tokens = batch.num_tokens;
  std::memcpy(h + a.off_slots, batch.slot_mapping.data(), tokens * 4);
  std::fill(h + a.off_slots + tokens, h + a.off_slots + shape.rows(), -1);  // padding: no append
  for (int v = 0; v < kMlaNumRowVariants; ++v) {
    if (!plan.items[v].empty()) {
      std::memcpy(h + a.off_items[v], plan.items[v].data(),
                  plan.items[v].size() * sizeof(MlaWorkItem));
    }
  }
  if (!plan.merges.empty()) {
    std::memcpy(h + a.off_merge, plan.merges.data(), plan.merges.size() * sizeof(MlaMergeItem));
  }
  if (!batch.page_indices.empty()) {
    std::memcpy(h + a.off_pages, batch.page_indices.data(), batch.page_indices.size() * 4);
  }
  LLM_RETURN_IF_ERROR(a.ints.Send(bytes, stream));
  // Grids of the shape: the same launches for every step of it, whatever its plan.
  a.num_tokens = shape.rows();
  int rows = kMlaVariantRows[0];
  for (int v = 0; v < kMlaNumRowVariants; ++v) {
    a.num_items[v] = GraphItemCapacity(shape, v);
    if (a.num_items[v] > 0) rows = kMlaVariantRows[v];
  }
  a.merge_rows = rows;
  // The merge CTAs stride over the items: one resident wave of 128-thread CTAs (16 per SM).
  a.num_merges =
      std::min(GraphMergeCapacity(shape), std::max(1, graph_config_.num_sms * 16 / rows));
  active_ = &graph_;
  return Status::Ok();
}

Status MlaDecode::Run(const LayerArgs& args, void* stream) {
  const Area& ar = *active_;
  const auto* ints = ar.ints.device();
  const mla::AppendArgs ap{args.latent_new, args.cache, ints + ar.off_slots, ar.num_tokens,
                           args.cache_scale};
  mla::LaunchAppend(ap, shape_.cache, stream);
  GPU_RETURN_IF_ERROR(cudaGetLastError());
  return Attend(args, stream);
}

Status MlaDecode::Attend(const LayerArgs& args, void* stream) {
  const bool fp8 = shape_.cache == MlaCacheType::kFp8E4M3;
  if (fp8 && !(args.cache_scale > 0.f && std::isfinite(args.cache_scale))) {
    return InvalidArgument("MLA fp8 cache needs a positive finite cache_scale");
  }
  LLM_RETURN_IF_ERROR(CheckKernelChoice(shape_));
  const Area& ar = *active_;
  const auto* ints = ar.ints.device();
  float* partial_o = static_cast<float*>(ar.d_partial);
  float* partial_lse =
      partial_o + static_cast<size_t>(ar.num_partials) * kMlaMaxRows * kMlaLatentDim;
  const int32_t* counts = ar.device_counts ? ints + ar.off_counts : nullptr;
  mla::AttendArgs a{};
  a.q_latent = args.q_latent;
  a.q_pe = args.q_pe;
  a.out = args.out_latent;
  a.cache = args.cache;
  a.q_indptr = ints + ar.off_q_indptr;
  a.kv_lens = ints + ar.off_kv_lens;
  a.page_indptr = ints + ar.off_page_indptr;
  a.pages = ints + ar.off_pages;
  a.partial_o = partial_o;
  a.partial_lse = partial_lse;
  a.num_heads = shape_.num_heads;
  a.block_size = shape_.block_size;
  a.scale_log2 = args.softmax_scale * 1.4426950408889634f * (fp8 ? args.cache_scale : 1.f);
  a.out_scale = fp8 ? args.cache_scale : 1.f;
  for (int v = 0; v < kMlaNumRowVariants; ++v) {
    a.items = reinterpret_cast<const MlaWorkItem*>(ints + ar.off_items[v]);
    a.num_items = ar.num_items[v];
    a.device_num_items = counts ? counts + v : nullptr;
    if (uses_wgmma(v)) {
#if LLM_MLA_WGMMA
      const bool launched = fp8 ? mla::LaunchAttendFp8Wgmma(a, kMlaVariantRows[v], stream)
                            : uses_seesaw(v) ? mla::LaunchAttendBf16Seesaw(a, stream)
                                             : mla::LaunchAttendBf16Wgmma(a, stream);
      if (!launched) {
        return Internal("MLA decode: cuTensorMapEncodeTiled failed for the latent cache");
      }
#endif
    } else if (fp8) {
      mla::LaunchAttendFp8(a, kMlaVariantRows[v], uses_fp8_mma(), stream);
    } else {
      mla::LaunchAttendBf16(a, kMlaVariantRows[v], stream);
    }
    GPU_RETURN_IF_ERROR(cudaGetLastError());
  }
  mla::MergeArgs ma{args.out_latent, reinterpret_cast<const MlaMergeItem*>(ints + ar.off_merge),
                    partial_o,       partial_lse,
                    ar.num_merges,   shape_.num_heads};
  ma.device_num_items = counts ? counts + kMlaNumRowVariants : nullptr;
  mla::LaunchMerge(ma, ar.merge_rows, stream);
  GPU_RETURN_IF_ERROR(cudaGetLastError());
  return Status::Ok();
}

}  // namespace llm::cuda
