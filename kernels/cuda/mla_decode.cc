#include "kernels/cuda/mla_decode.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/mla_kernel_args.h"

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
    if (q_len < 1 || q_len > kMlaMaxDecodeQueryLen) continue;  // prefill rows: the caller's
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
      const int64_t ctas = std::max<int64_t>(1, (t.kv_end + chunk - 1) / chunk);
      w += static_cast<double>(ctas) /
           (std::max(1, config.num_sms) * std::max(1, config.ctas_per_sm[t.variant]));
    }
    return w;
  };
  auto efficiency = [](double waves) {
    return waves <= 1.0 ? waves : waves / std::ceil(waves - 1e-9);
  };
  const int min_chunk = std::max(64, (config.min_chunk_tokens + 63) / 64 * 64);
  int64_t chunk = std::max(max_kv, 1);
  if (config.force_split) {
    chunk = min_chunk;
  } else if (!tiles.empty()) {
    double best = efficiency(waves_for(chunk));
    for (int n = 2; n <= config.max_splits; ++n) {
      const int64_t c = ((max_kv + n - 1) / n + 63) / 64 * 64;
      if (c < min_chunk) break;
      const double waves = waves_for(c);
      const double e = efficiency(waves);
      // Under one wave more CTAs are always better; past it, demand a real gain per split.
      if (waves <= 1.0 ? e > best : e > best + 0.03) {
        best = e;
        chunk = c;
      }
    }
  }
  chunk = (chunk + 63) / 64 * 64;
  for (const Tile& t : tiles) {
    auto& items = plan.items[t.variant];
    if (t.kv_end <= chunk) {
      items.push_back({t.seq, t.q_start, t.q_len, t.head_start, t.num_heads, 0, t.kv_end, -1});
      continue;
    }
    const int n = static_cast<int>((t.kv_end + chunk - 1) / chunk);
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
  // so the hi/lo split doubles the tensor time (H200, 16 heads x 4096: 200 us against 147) and
  // kAuto keeps the f16 kernel there; Ada and consumer Blackwell (sm_89, sm_120) run fp8
  // mma.sync at twice the f16 rate.
  if (shape_.fp8_math == MlaFp8Math::kAuto && CurrentDeviceIsSm90()) return false;
  return MlaFp8MmaAvailable();
}

bool MlaDecode::uses_wgmma(int variant) const {
  if (shape_.kernel == MlaKernel::kPortable) return false;
  if (shape_.cache == MlaCacheType::kFp8E4M3) {
    // fp8: 16- and 32-row items on the transposed e4m3 wgmma kernel (mla_decode_fp8_wgmma.cu:
    // 84 us against 149 portable at 16 heads x 4096 on the H200); 64-row items (its O^T would
    // not fit in registers) stay portable.
    return kMlaVariantRows[variant] <= 32 && MlaWgmmaAvailable();
  }
  return MlaWgmmaAvailable();
}

bool MlaDecode::uses_seesaw(int variant) const {
  if (shape_.cache != MlaCacheType::kBf16 || !uses_wgmma(variant)) return false;
  if (shape_.bf16_schedule == MlaBf16Schedule::kRing) return false;
  if (shape_.block_size % 64 != 0) return false;  // kSeesaw here is refused by CheckKernelChoice
  // kAuto: 64-row items only. Padded 16- and 32-row items are memory-bound, and there the ring's
  // producer keeps more copies in flight (H200, 16 heads x 4096: 4.00 TB/s against 3.86-3.92).
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

MlaDecode::~MlaDecode() {
  if (d_ints_) cudaFree(d_ints_);
  if (d_partial_) cudaFree(d_partial_);
}

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
  num_tokens_ = batch.num_tokens;
  for (int v = 0; v < kMlaNumRowVariants; ++v) {
    num_items_[v] = static_cast<int>(plan.items[v].size());
  }
  num_merges_ = static_cast<int>(plan.merges.size());
  num_partials_ = plan.num_partials;
  // Layout of the one upload, in int32 elements (every part starts 16-byte aligned).
  size_t off = 0;
  auto take = [&](size_t n) {
    const size_t o = off;
    off += (n + 3) / 4 * 4;
    return o;
  };
  off_q_indptr_ = take(batch.q_indptr.size());
  off_kv_lens_ = take(batch.kv_lens.size());
  off_page_indptr_ = take(batch.page_indptr.size());
  off_pages_ = take(batch.page_indices.size());
  off_slots_ = take(batch.slot_mapping.size());
  for (int v = 0; v < kMlaNumRowVariants; ++v) {
    off_items_[v] = take(plan.items[v].size() * sizeof(MlaWorkItem) / 4);
  }
  off_merge_ = take(plan.merges.size() * sizeof(MlaMergeItem) / 4);
  const size_t bytes = off * 4;
  LLM_ASSIGN_OR_RETURN(void* staged, staging_.Acquire(bytes));
  auto* h = static_cast<int32_t*>(staged);
  auto put = [&](size_t o, const void* src, size_t n_bytes) {
    if (n_bytes) std::memcpy(h + o, src, n_bytes);
  };
  put(off_q_indptr_, batch.q_indptr.data(), batch.q_indptr.size() * 4);
  put(off_kv_lens_, batch.kv_lens.data(), batch.kv_lens.size() * 4);
  put(off_page_indptr_, batch.page_indptr.data(), batch.page_indptr.size() * 4);
  put(off_pages_, batch.page_indices.data(), batch.page_indices.size() * 4);
  put(off_slots_, batch.slot_mapping.data(), batch.slot_mapping.size() * 4);
  for (int v = 0; v < kMlaNumRowVariants; ++v) {
    put(off_items_[v], plan.items[v].data(), plan.items[v].size() * sizeof(MlaWorkItem));
  }
  put(off_merge_, plan.merges.data(), plan.merges.size() * sizeof(MlaMergeItem));
  LLM_RETURN_IF_ERROR(GrowDeviceBuffer(&d_ints_, &d_ints_cap_, std::max<size_t>(bytes, 256)));
  if (bytes) {
    GPU_RETURN_IF_ERROR(cudaMemcpyAsync(d_ints_, staged, bytes, cudaMemcpyHostToDevice,
                                        static_cast<cudaStream_t>(stream)));
    LLM_RETURN_IF_ERROR(staging_.Queued(stream));
  }
  const size_t rows = static_cast<size_t>(num_partials_) * kMlaMaxRows;
  LLM_RETURN_IF_ERROR(GrowDeviceBuffer(&d_partial_, &d_partial_cap_,
                                       std::max<size_t>(rows * (kMlaLatentDim + 1) * 4, 256)));
  return Status::Ok();
}

Status MlaDecode::Run(const LayerArgs& args, void* stream) {
  const auto* ints = static_cast<const int32_t*>(d_ints_);
  const mla::AppendArgs ap{args.latent_new, args.cache, ints + off_slots_, num_tokens_,
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
  const auto* ints = static_cast<const int32_t*>(d_ints_);
  float* partial_o = static_cast<float*>(d_partial_);
  float* partial_lse = partial_o + static_cast<size_t>(num_partials_) * kMlaMaxRows * kMlaLatentDim;
  mla::AttendArgs a{};
  a.q_latent = args.q_latent;
  a.q_pe = args.q_pe;
  a.out = args.out_latent;
  a.cache = args.cache;
  a.q_indptr = ints + off_q_indptr_;
  a.kv_lens = ints + off_kv_lens_;
  a.page_indptr = ints + off_page_indptr_;
  a.pages = ints + off_pages_;
  a.partial_o = partial_o;
  a.partial_lse = partial_lse;
  a.num_heads = shape_.num_heads;
  a.block_size = shape_.block_size;
  a.scale_log2 = args.softmax_scale * 1.4426950408889634f * (fp8 ? args.cache_scale : 1.f);
  a.out_scale = fp8 ? args.cache_scale : 1.f;
  for (int v = 0; v < kMlaNumRowVariants; ++v) {
    a.items = reinterpret_cast<const MlaWorkItem*>(ints + off_items_[v]);
    a.num_items = num_items_[v];
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
  const mla::MergeArgs ma{args.out_latent, reinterpret_cast<const MlaMergeItem*>(ints + off_merge_),
                          partial_o,       partial_lse,
                          num_merges_,     shape_.num_heads};
  mla::LaunchMerge(ma, stream);
  GPU_RETURN_IF_ERROR(cudaGetLastError());
  return Status::Ok();
}

}  // namespace llm::cuda
