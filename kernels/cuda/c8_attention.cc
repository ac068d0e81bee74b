#include "kernels/cuda/c8_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cuda/c8_kernel_args.h"
#include "kernels/cuda/cuda_check.h"

namespace llm::cuda {

int CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

int CudaNumSms() {
  if (CudaDeviceCount() == 0) return 0;
  int dev = 0, sms = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  return sms;
}

C8Plan BuildC8Plan(const C8Shape& shape, const AttentionBatch& batch, const C8PlanConfig& config) {
  C8Plan plan;
  const int group = shape.num_q_heads / shape.num_kv_heads;
  plan.decode_tile_tokens = group <= detail::kDecodeRows ? detail::kDecodeRows / group : 0;
  plan.prefill_tile_tokens = std::max(1, detail::kPartialRows / group);

  struct Tile {
    int seq, q_start, q_len, kv_end;
    bool prefill;
  };
  std::vector<Tile> tiles;
  int64_t total_kv = 0;
  for (int s = 0; s < batch.num_seqs; ++s) {
    const int q0 = batch.q_indptr[s], q_len = batch.q_indptr[s + 1] - q0;
    const int kv_len = batch.kv_lens[s];
    if (q_len == 0) continue;
    const bool prefill = q_len > plan.decode_tile_tokens;
    const int tile_tokens = prefill ? plan.prefill_tile_tokens : plan.decode_tile_tokens;
    for (int t0 = 0; t0 < q_len; t0 += tile_tokens) {
      const int len = std::min(tile_tokens, q_len - t0);
      // Causal: the tile's last query sits at position kv_len - q_len + t0 + len - 1.
      const int kv_end = kv_len - q_len + t0 + len;
      tiles.push_back({s, q0 + t0, len, kv_end, prefill});
      total_kv += kv_end;
    }
  }
  // Choose the KV chunk so that the CTAs fill the resident slots in full waves: a 1.3-wave grid
  // idles most SMs during its tail, and a tiny batch leaves most SMs empty without a split.
  const int64_t slots = std::max(1, config.num_sms * config.ctas_per_sm);
  int max_kv = 0;
  for (const Tile& t : tiles) max_kv = std::max(max_kv, t.kv_end);
  // Only decode tiles are split: prefill tiles are plentiful and the merge would cost more.
  bool any_decode = false;
  for (const Tile& t : tiles) any_decode |= !t.prefill;
  auto ctas_for = [&](int64_t chunk) {
    int64_t n = 0;
    for (const Tile& t : tiles) {
      if (!t.prefill) n += (t.kv_end + chunk - 1) / chunk;
    }
    return n * shape.num_kv_heads;
  };
  auto efficiency = [&](int64_t ctas) {
    const double waves = static_cast<double>(ctas) / slots;
    return waves <= 1.0 ? waves : waves / std::ceil(waves);
  };
  int64_t chunk = std::max(max_kv, 1);
  if (config.force_split) {
    chunk = config.min_chunk_tokens;
  } else if (any_decode) {
    double best = efficiency(ctas_for(chunk));
    for (int n = 2; n <= config.max_splits; ++n) {
      const int64_t c = ((max_kv + n - 1) / n + 63) / 64 * 64;
      if (c < config.min_chunk_tokens) break;
      // Under one wave, more CTAs are always better; past it, demand a real gain per split.
      const int64_t ctas = ctas_for(c);
      const double e = efficiency(ctas);
      const bool better = ctas <= slots ? e > best : e > best + 0.03;
      if (better) {
        best = e;
        chunk = c;
      }
    }
  }
  chunk = (chunk + 63) / 64 * 64;
  for (const Tile& t : tiles) {
    auto& items = t.prefill ? plan.prefill_items : plan.decode_items;
    if (t.kv_end <= chunk || (t.prefill && !config.force_split)) {
      items.push_back({t.seq, t.q_start, t.q_len, 0, t.kv_end, -1});
      continue;
    }
    const int n = static_cast<int>((t.kv_end + chunk - 1) / chunk);
    plan.merges.push_back({t.q_start, t.q_len, plan.num_partials, n});
    for (int c = 0; c < n; ++c) {
      const int b = static_cast<int>(c * chunk);
      const int e = static_cast<int>(std::min<int64_t>(t.kv_end, b + chunk));
      items.push_back({t.seq, t.q_start, t.q_len, b, e, plan.num_partials++});
    }
  }
  return plan;
}

C8Attention::C8Attention(const C8Shape& shape) : shape_(shape) {}

int C8Attention::decode_ctas_per_sm() const {
  switch (shape_.cache) {
    case CacheType::kBf16:
      return detail::DecodeCtasPerSmBf16(shape_.head_dim);
    case CacheType::kInt8:
      return detail::DecodeCtasPerSmInt8(shape_.head_dim);
    case CacheType::kFp8E4M3:
      return detail::DecodeCtasPerSmFp8(shape_.head_dim);
  }
  return 1;
}

C8Attention::~C8Attention() {
  if (d_ints_) cudaFree(d_ints_);
  if (d_partial_) cudaFree(d_partial_);
  if (h_pinned_) cudaFreeHost(h_pinned_);
}

Status C8Attention::Upload(const AttentionBatch& batch, const C8Plan& plan, void* stream) {
  static_assert(sizeof(C8WorkItem) % 4 == 0 && sizeof(C8MergeItem) % 4 == 0);
  num_seqs_ = batch.num_seqs;
  num_tokens_ = batch.num_tokens;
  num_decode_ = static_cast<int>(plan.decode_items.size());
  num_prefill_ = static_cast<int>(plan.prefill_items.size());
  num_merges_ = static_cast<int>(plan.merges.size());
  num_partials_ = plan.num_partials;
  // Layout of the one upload, in int32 elements (every section 16-byte aligned).
  auto align4 = [](size_t n) { return (n + 3) / 4 * 4; };
  size_t off = 0;
  auto take = [&](size_t n) {
    const size_t o = off;
    off += align4(n);
    return o;
  };
  off_q_indptr_ = take(batch.q_indptr.size());
  off_kv_lens_ = take(batch.kv_lens.size());
  off_page_indptr_ = take(batch.page_indptr.size());
  off_pages_ = take(batch.page_indices.size());
  off_slots_ = take(batch.slot_mapping.size());
  off_decode_ = take(plan.decode_items.size() * sizeof(C8WorkItem) / 4);
  off_prefill_ = take(plan.prefill_items.size() * sizeof(C8WorkItem) / 4);
  off_merge_ = take(plan.merges.size() * sizeof(C8MergeItem) / 4);
  const size_t bytes = off * 4;
  // The host buffer may still feed the previous step's copy: wait for the stream first.
  GPU_RETURN_IF_ERROR(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
  LLM_RETURN_IF_ERROR(GrowPinnedBuffer(&h_pinned_, &h_pinned_cap_, bytes));
  auto* h = static_cast<int32_t*>(h_pinned_);
  auto put = [&](size_t o, const void* src, size_t n_bytes) {
    if (n_bytes) std::memcpy(h + o, src, n_bytes);
  };
  put(off_q_indptr_, batch.q_indptr.data(), batch.q_indptr.size() * 4);
  put(off_kv_lens_, batch.kv_lens.data(), batch.kv_lens.size() * 4);
  put(off_page_indptr_, batch.page_indptr.data(), batch.page_indptr.size() * 4);
  put(off_pages_, batch.page_indices.data(), batch.page_indices.size() * 4);
  put(off_slots_, batch.slot_mapping.data(), batch.slot_mapping.size() * 4);
  put(off_decode_, plan.decode_items.data(), plan.decode_items.size() * sizeof(C8WorkItem));
  put(off_prefill_, plan.prefill_items.data(), plan.prefill_items.size() * sizeof(C8WorkItem));
  put(off_merge_, plan.merges.data(), plan.merges.size() * sizeof(C8MergeItem));
  LLM_RETURN_IF_ERROR(GrowDeviceBuffer(&d_ints_, &d_ints_cap_, std::max<size_t>(bytes, 256)));
  GPU_RETURN_IF_ERROR(cudaMemcpyAsync(d_ints_, h_pinned_, bytes, cudaMemcpyHostToDevice,
                                      static_cast<cudaStream_t>(stream)));
  const size_t rows =
      static_cast<size_t>(num_partials_) * shape_.num_kv_heads * detail::kPartialRows;
  LLM_RETURN_IF_ERROR(GrowDeviceBuffer(&d_partial_, &d_partial_cap_,
                                       std::max<size_t>(rows * (shape_.head_dim + 1) * 4, 256)));
  return Status::Ok();
}

Status C8Attention::Run(const LayerArgs& args, void* stream) {
  const auto* ints = static_cast<const int32_t*>(d_ints_);
  detail::AppendArgs ap{args.k_new,
                        args.v_new,
                        args.k_cache,
                        args.v_cache,
                        args.k_scale,
                        args.v_scale,
                        ints + off_slots_,
                        num_tokens_,
                        shape_.num_kv_heads,
                        shape_.block_size,
                        static_cast<int>(shape_.scale)};
  detail::LaunchAppend(ap, shape_.cache, shape_.head_dim, stream);
  GPU_RETURN_IF_ERROR(cudaGetLastError());
  return Attend(args, stream);
}

Status C8Attention::Attend(const LayerArgs& args, void* stream) {
  const auto* ints = static_cast<const int32_t*>(d_ints_);
  float* partial_o = static_cast<float*>(d_partial_);
  float* partial_lse = partial_o + static_cast<size_t>(num_partials_) * shape_.num_kv_heads *
                                       detail::kPartialRows * shape_.head_dim;
  detail::TileArgs ta{};
  ta.q = args.q;
  ta.out = args.out;
  ta.k_cache = args.k_cache;
  ta.v_cache = args.v_cache;
  ta.k_scale = args.k_scale;
  ta.v_scale = args.v_scale;
  ta.q_indptr = ints + off_q_indptr_;
  ta.kv_lens = ints + off_kv_lens_;
  ta.page_indptr = ints + off_page_indptr_;
  ta.pages = ints + off_pages_;
  ta.partial_o = partial_o;
  ta.partial_lse = partial_lse;
  ta.num_q_heads = shape_.num_q_heads;
  ta.num_kv_heads = shape_.num_kv_heads;
  int lbs = 0;
  while ((1 << lbs) < shape_.block_size) ++lbs;
  if ((1 << lbs) != shape_.block_size) {
    return InvalidArgument("C8 attention needs a power-of-two block size, got " +
                           std::to_string(shape_.block_size));
  }
  ta.log2_block_size = lbs;
  ta.scale_mode = static_cast<int>(shape_.scale);
  ta.scale_log2 = args.softmax_scale * 1.4426950408889634f;
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
  launch(reinterpret_cast<const C8WorkItem*>(ints + off_decode_), num_decode_, false);
  GPU_RETURN_IF_ERROR(cudaGetLastError());
  launch(reinterpret_cast<const C8WorkItem*>(ints + off_prefill_), num_prefill_, true);
  GPU_RETURN_IF_ERROR(cudaGetLastError());
  detail::MergeArgs ma{args.out,           reinterpret_cast<const C8MergeItem*>(ints + off_merge_),
                       partial_o,          partial_lse,
                       num_merges_,        shape_.num_q_heads,
                       shape_.num_kv_heads};
  detail::LaunchMerge(ma, shape_.head_dim, stream);
  GPU_RETURN_IF_ERROR(cudaGetLastError());
  return Status::Ok();
}

}  // namespace llm::cuda
