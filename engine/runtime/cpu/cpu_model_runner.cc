#include "engine/runtime/cpu/cpu_model_runner.h"

#include <algorithm>
#include <cmath>

#include <spdlog/spdlog.h>

#include "engine/layers/cpu/cpu_ops.h"
#include "engine/layers/cpu/cpu_weights.h"
#include "engine/loader/kv_cache_quant.h"
#include "kernels/backend_registry.h"

namespace llm {

StatusOr<std::unique_ptr<CpuModelRunner>> CpuModelRunner::Create(
    std::unique_ptr<CpuArchitecture> arch, const WeightStore& weights,
    const ModelLoadOptions& options, CpuTensorParallelRank tp) {
  std::unique_ptr<CpuModelRunner> m(new CpuModelRunner(std::move(arch)));
  LLM_RETURN_IF_ERROR(m->Init(weights, options, tp));
  return m;
}

Status CpuModelRunner::Init(const WeightStore& w, const ModelLoadOptions& options,
                            const CpuTensorParallelRank& tp) {
  if ((tp.plan == nullptr) != (tp.comm == nullptr)) {
    return InvalidArgument("a tensor-parallel rank needs both its plan and its communicator");
  }
  config_ = tp.plan != nullptr ? tp.plan->model : arch_->config();
  comm_ = tp.comm;
  if (tp.plan != nullptr &&
      (tp.comm->size() != tp.plan->size || tp.comm->rank() != tp.plan->rank)) {
    return InvalidArgument("communicator rank " + std::to_string(tp.comm->rank()) + " of " +
                           std::to_string(tp.comm->size()) + " disagrees with the plan's rank " +
                           std::to_string(tp.plan->rank) + " of " + std::to_string(tp.plan->size));
  }
  // The architecture's configuration: the rank's on a tensor-parallel rank.
  const ModelConfig& c = arch_->config();
  head_rows_ = c.vocab_size;
  vocab_begin_ = tp.plan != nullptr ? tp.plan->vocab_begin : 0;
  vocab_rows_ = tp.plan != nullptr ? tp.plan->vocab_rows : c.vocab_size;
  // The CUDA runner's kernel choices: the CPU attends every step through one backend, so another
  // value than the default is refused, not ignored.
  const std::pair<const char*, const std::string*> cuda_choices[] = {
      {"prefill_attention_backend", &options.prefill_attention_backend},
      {"c8_prefill", &options.c8_prefill},
      {"mla_kernel", &options.mla_kernel}};
  for (const auto& [name, value] : cuda_choices) {
    const bool neutral = *value == "auto" || (*value == "none" && name[0] == 'p');
    if (!neutral) {
      return InvalidArgument(std::string(name) + " " + *value +
                             ": a kernel choice of the cuda device (the cpu device attends every "
                             "step through one backend)");
    }
  }
  LLM_ASSIGN_OR_RETURN(spec_, arch_->MakeAttentionSpec(options));
  std::string table;
  auto backend = BackendRegistry::Global().Create(spec_, options.attention_backend, &table);
  spdlog::info("{}", table);
  if (!backend.ok()) return backend.status();  // fail before loading weights or allocating KV
  attention_ = std::move(backend).value();
  if (spec_.kind == AttentionKind::kMla) {
    mla_ = attention_->mla();
    if (mla_ == nullptr) {
      return Internal("backend '" + attention_->name() +
                      "' registered as MLA does not implement MlaAttentionBackend");
    }
  }
  const KvCacheType kv_type{spec_.kv_dtype, spec_.kv_quant};
  if (kv_type.is_static()) {  // before the weights: a missing scale fails fast
    LLM_ASSIGN_OR_RETURN(KvCacheScales scales,
                         LoadKvCacheScales(c, w, kv_type, options.kv_scales_file));
    spdlog::info("KV cache {} {}: scales from {}", DTypeName(spec_.kv_dtype),
                 KvQuantName(spec_.kv_quant), scales.source);
    k_scale_ = std::move(scales.k);
    v_scale_ = std::move(scales.v);
  } else if (!options.kv_scales_file.empty()) {
    spdlog::warn("kv_scales_file {} ignored: the {} KV cache uses no static scales",
                 options.kv_scales_file, options.kv_cache_dtype);
  }

  settings_ = arch_->settings();
  LLM_RETURN_IF_ERROR(
      ReadEmbeddingAndHead(w, c, &embed_, &lm_head_, settings_.embed_tokens, settings_.lm_head));
  LLM_RETURN_IF_ERROR(w.ReadF32(settings_.final_norm, {c.hidden_size}, &final_norm_));
  for (float& x : final_norm_) x += settings_.norm_weight_offset;
  LLM_RETURN_IF_ERROR(arch_->LoadLayers(w));

  block_size_ = options.block_size;
  if (options.defer_kv_cache) return Status::Ok();  // AllocateKvCache, with the caller's count
  // The blocks hold this model's K/V and whatever another model keeps under the same ids.
  const size_t per_block = kv_bytes_per_block() + options.extra_kv_bytes_per_block;
  const int num_blocks = options.num_kv_blocks > 0
                             ? options.num_kv_blocks
                             : static_cast<int>(options.kv_cache_bytes / per_block);
  if (num_blocks < 1) {
    return ResourceExhausted("KV cache budget of " + std::to_string(options.kv_cache_bytes) +
                             " bytes holds no block of " + std::to_string(per_block) + " bytes");
  }
  return AllocateKvCache(num_blocks);
}

Status CpuModelRunner::AllocateKvCache(int num_blocks) {
  if (num_blocks_ > 0) return FailedPrecondition("the KV cache is allocated already");
  if (num_blocks < 1) return InvalidArgument("a KV cache needs at least one block");
  num_blocks_ = num_blocks;
  LLM_RETURN_IF_ERROR(AllocateCache());
  if (const std::string s = arch_->CacheSummary(spec_); !s.empty()) spdlog::info("{}", s);
  return Status::Ok();
}

Status CpuModelRunner::AllocateCache() {
  const int layers = config().num_layers;
  const KvCacheLayout layout = KvCacheLayout::Of(spec_);
  if (layout.block_bytes() != attention_->BlockBytes()) {
    return Internal("attention backend " + attention_->name() + " reports " +
                    std::to_string(attention_->BlockBytes()) + " bytes per block, not the " +
                    std::to_string(layout.block_bytes()) + " of the spec's KV cache layout");
  }
  const int tensors = layout.tensors;
  const size_t data_bytes = layout.data_bytes;
  const size_t scale_floats = layout.scale_bytes / sizeof(float);
  const size_t layer_floats = (data_bytes * num_blocks_ + sizeof(float) - 1) / sizeof(float);
  k_cache_.assign(layers, std::vector<float>(layer_floats, 0.0f));
  if (tensors == 2) v_cache_.assign(layers, std::vector<float>(layer_floats, 0.0f));
  if (scale_floats > 0) {
    k_block_scales_.assign(layers, std::vector<float>(scale_floats * num_blocks_, 1.0f));
    v_block_scales_.assign(layers, std::vector<float>(scale_floats * num_blocks_, 1.0f));
  }
  kv_.assign(layers, KvCacheLayer{});
  for (int l = 0; l < layers; ++l) {
    KvCacheLayer& kv = kv_[l];
    kv.k = k_cache_[l].data();
    if (!v_cache_.empty()) kv.v = v_cache_[l].data();
    if (!k_scale_.empty()) {
      kv.k_scale = k_scale_[l].data();
      kv.v_scale = v_scale_[l].data();
    }
    if (!k_block_scales_.empty()) {
      kv.k_block_scales = k_block_scales_[l].data();
      kv.v_block_scales = v_block_scales_[l].data();
    }
  }
  return Status::Ok();
}

bool CpuModelRunner::set_routing_trace(std::vector<MoeRoutingDecision>* trace) {
  const bool routes = arch_->routes_experts();
  routing_trace_ = routes ? trace : nullptr;
  return routes;
}

bool CpuModelRunner::set_kv_observer(KvObserver observer) {
  if (spec_.kind != AttentionKind::kMha) return false;
  kv_observer_ = std::move(observer);
  return true;
}

Status CpuModelRunner::Forward(const ForwardBatch& batch, std::vector<float>* logits) {
  const ModelConfig& c = config();
  const int T = static_cast<int>(batch.token_ids.size());
  const int H = c.hidden_size;
  LLM_CHECK_EQ(batch.attn.num_tokens, T);
  LLM_CHECK_EQ(static_cast<int>(batch.positions.size()), T);

  std::vector<float> x(static_cast<size_t>(T) * H);  // residual stream [T, H]
  for (int t = 0; t < T; ++t) {
    const int32_t id = batch.token_ids[t];
    if (id < 0 || id >= c.vocab_size) return InvalidArgument("token id out of range");
    // A tensor-parallel rank holds some rows of the table: zeros for the others, summed below.
    const int64_t row = id - vocab_begin_;
    if (row < 0 || row >= vocab_rows_) continue;
    float* xt = x.data() + static_cast<size_t>(t) * H;
    std::copy_n(embed_.data() + static_cast<size_t>(row) * H, H, xt);
    if (settings_.embed_scale != 1.0f) {
      for (int i = 0; i < H; ++i) xt[i] *= settings_.embed_scale;
    }
  }
  if (arch_->reads_input_hidden() ? batch.input_hidden.size() != static_cast<size_t>(T) * H
                                  : !batch.input_hidden.empty()) {
    return InvalidArgument("input_hidden has " + std::to_string(batch.input_hidden.size()) +
                           " values for " + std::to_string(T) + " tokens of hidden size " +
                           std::to_string(H) +
                           (arch_->reads_input_hidden() ? "" : "; this model reads none"));
  }
  for (int32_t r : batch.hidden_rows) {
    if (r < 0 || r >= T) return InvalidArgument("hidden row out of range");
  }
  LLM_RETURN_IF_ERROR(CheckAttentionBatch(batch.attn, block_size_, num_blocks_));
  LLM_RETURN_IF_ERROR(attention_->Plan(batch.attn));
  if (comm_ != nullptr) {  // every rank's embedding rows, zeros elsewhere
    LLM_RETURN_IF_ERROR(comm_->AllReduceSum(x.data(), x.size(), DType::kF32, nullptr));
  }

  CpuStep step;
  step.batch = &batch;
  step.num_tokens = T;
  step.residual = x.data();
  step.kv = kv_;
  step.spec = &spec_;
  step.attention = attention_.get();
  step.mla = mla_;
  step.routing_trace = routing_trace_;
  step.kv_observer = kv_observer_ ? &kv_observer_ : nullptr;
  step.comm = comm_;
  LLM_RETURN_IF_ERROR(arch_->RunLayers(step));

  hidden_.resize(batch.hidden_rows.size() * H);
  for (size_t r = 0; r < batch.hidden_rows.size(); ++r) {
    const float* xr = x.data() + static_cast<size_t>(batch.hidden_rows[r]) * H;
    float* out = hidden_.data() + r * H;
    if (batch.hidden_before_final_norm) {
      std::copy_n(xr, H, out);
    } else {
      cpu::RmsNorm(xr, final_norm_.data(), 1, H, settings_.norm_eps, out);
    }
  }
  LLM_RETURN_IF_ERROR(Logits(x.data(), batch.logit_rows, logits));
  if (const float cap = settings_.final_logit_softcap; cap > 0.0f) {
    for (float& v : *logits) v = cap * std::tanh(v / cap);
  }
  return Status::Ok();
}

Status CpuModelRunner::Logits(const float* x, const std::vector<int32_t>& logit_rows,
                              std::vector<float>* logits) {
  const ModelConfig& c = config();
  const int H = c.hidden_size;
  const float* head = (c.tie_word_embeddings ? embed_ : lm_head_).data();
  // Final norm and LM head only for the rows that sample.
  if (comm_ == nullptr) {
    cpu::FinalLogits(x, logit_rows, final_norm_.data(), head, H, c.vocab_size, settings_.norm_eps,
                     logits);
    return Status::Ok();
  }
  if (logit_rows.empty()) {  // every rank has the same rows: none gathers
    logits->clear();
    return Status::Ok();
  }
  std::vector<float> slice;  // [rows, head_rows_]
  cpu::FinalLogits(x, logit_rows, final_norm_.data(), head, H, static_cast<int>(head_rows_),
                   settings_.norm_eps, &slice);
  const size_t rows = logit_rows.size(), n = rows * head_rows_;
  std::vector<float> all(n * comm_->size());  // [ranks, rows, head_rows_]
  LLM_RETURN_IF_ERROR(comm_->AllGather(slice.data(), all.data(), n, DType::kF32, nullptr));
  logits->resize(rows * c.vocab_size);
  for (size_t r = 0; r < rows; ++r) {
    for (int k = 0; k < comm_->size(); ++k) {
      // Rank k's rows begin at k * head_rows_; the last ranks' end with padding.
      const int64_t begin = k * head_rows_;
      const int64_t count = std::min<int64_t>(head_rows_, c.vocab_size - begin);
      if (count <= 0) break;
      std::copy_n(all.begin() + k * n + r * head_rows_, count,
                  logits->begin() + r * c.vocab_size + begin);
    }
  }
  return Status::Ok();
}

}  // namespace llm
