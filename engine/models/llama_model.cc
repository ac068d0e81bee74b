#include "engine/models/llama_model.h"

#include <cblas.h>

#include <cmath>

#include <spdlog/spdlog.h>

#include "engine/models/cpu_ops.h"
#include "engine/models/kv_cache_quant.h"
#include "engine/models/rope.h"
#include "kernels/backend_registry.h"

namespace llm {
using cpu::Linear;
using cpu::RmsNorm;

StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Create(const ModelConfig& config,
                                                         const WeightStore& weights,
                                                         const ModelLoadOptions& options) {
  std::unique_ptr<LlamaModel> m(new LlamaModel(config));
  LLM_ASSIGN_OR_RETURN(const KvCacheType kv_type,
                       ParseKvCacheType(options.kv_cache_dtype, options.kv_scale_granularity));
  AttentionSpec spec;
  spec.device = DeviceKind::kCpu;
  spec.kind = AttentionKind::kMha;
  spec.kv_dtype = kv_type.dtype;
  spec.kv_quant = kv_type.quant;
  spec.num_q_heads = config.num_q_heads;
  spec.num_kv_heads = config.num_kv_heads;
  spec.head_dim = config.head_dim;
  spec.block_size = options.block_size;
  spec.features = kFeatureCausal;
  if (config.AnyLayerWindowed()) spec.features |= kFeatureSlidingWindow;
  std::string table;
  auto backend = BackendRegistry::Global().Create(spec, options.attention_backend, &table);
  spdlog::info("{}", table);
  if (!backend.ok()) return backend.status();  // fail before loading weights or allocating KV
  m->attention_ = std::move(backend).value();
  if (kv_type.is_static()) {  // before the weights: a missing scale fails fast
    LLM_ASSIGN_OR_RETURN(KvCacheScales scales,
                         LoadKvCacheScales(config, weights, kv_type, options.kv_scales_file));
    spdlog::info("KV cache {} {}: scales from {}", DTypeName(spec.kv_dtype),
                 KvQuantName(spec.kv_quant), scales.source);
    m->k_scale_ = std::move(scales.k);
    m->v_scale_ = std::move(scales.v);
  } else if (!options.kv_scales_file.empty()) {
    spdlog::warn("kv_scales_file {} ignored: the {} KV cache uses no static scales",
                 options.kv_scales_file, options.kv_cache_dtype);
  }

  LLM_RETURN_IF_ERROR(m->LoadWeights(weights));
  m->InitRope();

  const size_t per_block = m->attention_->BlockBytes() * config.num_layers;
  m->block_size_ = options.block_size;
  m->num_blocks_ = options.num_kv_blocks > 0 ? options.num_kv_blocks
                                             : static_cast<int>(options.kv_cache_bytes / per_block);
  if (m->num_blocks_ < 1) {
    return ResourceExhausted("KV cache budget of " + std::to_string(options.kv_cache_bytes) +
                             " bytes holds no block of " + std::to_string(per_block) + " bytes");
  }
  // Per block and layer, K and V each: slots * head_dim elements (+ one fp32 scale per slot when
  // dynamic). The backend's BlockBytes() must account for exactly that.
  const size_t slots = static_cast<size_t>(config.num_kv_heads) * options.block_size;
  const size_t data_bytes = slots * config.head_dim * DTypeSize(spec.kv_dtype);
  const size_t scale_floats = spec.kv_quant == KvQuant::kDynamicPerToken ? slots : 0;
  if (2 * (data_bytes + scale_floats * sizeof(float)) != m->attention_->BlockBytes()) {
    return Internal("attention backend " + m->attention_->name() + " reports " +
                    std::to_string(m->attention_->BlockBytes()) +
                    " bytes per block, not the layout LlamaModel allocates");
  }
  const size_t layer_floats = (data_bytes * m->num_blocks_ + sizeof(float) - 1) / sizeof(float);
  m->k_cache_.assign(config.num_layers, std::vector<float>(layer_floats, 0.0f));
  m->v_cache_.assign(config.num_layers, std::vector<float>(layer_floats, 0.0f));
  if (scale_floats > 0) {
    m->k_block_scales_.assign(config.num_layers,
                              std::vector<float>(scale_floats * m->num_blocks_, 1.0f));
    m->v_block_scales_.assign(config.num_layers,
                              std::vector<float>(scale_floats * m->num_blocks_, 1.0f));
  }
  return m;
}

Status LlamaModel::LoadWeights(const WeightStore& w) {
  const ModelConfig& c = config_;
  const int64_t h = c.hidden_size, q = c.q_size(), kv = c.kv_size(), inter = c.intermediate_size;
  const int64_t v = c.vocab_size;
  LLM_RETURN_IF_ERROR(w.ReadF32("model.embed_tokens.weight", {v, h}, &embed_));
  LLM_RETURN_IF_ERROR(w.ReadF32("model.norm.weight", {h}, &final_norm_));
  if (!c.tie_word_embeddings) {
    LLM_RETURN_IF_ERROR(w.ReadF32("lm_head.weight", {v, h}, &lm_head_));
  } else if (w.Has("lm_head.weight")) {
    // A tied checkpoint may still store the head; HF then ties it (drops it). Accept only a copy.
    std::vector<float> head;
    LLM_RETURN_IF_ERROR(w.ReadF32("lm_head.weight", {v, h}, &head));
    if (head != embed_) {
      return InvalidArgument(
          "tie_word_embeddings is true but lm_head.weight differs from model.embed_tokens.weight");
    }
  }
  layers_.resize(c.num_layers);
  std::vector<float> tmp;
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    LlamaLayerWeights& L = layers_[i];
    LLM_RETURN_IF_ERROR(w.ReadF32(p + "input_layernorm.weight", {h}, &L.attn_norm));
    LLM_RETURN_IF_ERROR(w.ReadF32(p + "post_attention_layernorm.weight", {h}, &L.mlp_norm));
    LLM_RETURN_IF_ERROR(w.ReadF32(p + "self_attn.o_proj.weight", {h, q}, &L.wo));
    LLM_RETURN_IF_ERROR(w.ReadF32(p + "mlp.down_proj.weight", {h, inter}, &L.w_down));
    if (c.o_bias) LLM_RETURN_IF_ERROR(w.ReadF32(p + "self_attn.o_proj.bias", {h}, &L.bo));
    if (c.mlp_bias) LLM_RETURN_IF_ERROR(w.ReadF32(p + "mlp.down_proj.bias", {h}, &L.b_down));
    // Stack q/k/v and gate/up so each is one matrix product.
    const std::pair<const char*, int64_t> qkv[] = {{"q_proj", q}, {"k_proj", kv}, {"v_proj", kv}};
    for (const auto& [name, rows] : qkv) {
      LLM_RETURN_IF_ERROR(w.ReadF32(p + "self_attn." + name + ".weight", {rows, h}, &tmp));
      L.wqkv.insert(L.wqkv.end(), tmp.begin(), tmp.end());
      if (c.qkv_bias) {
        LLM_RETURN_IF_ERROR(w.ReadF32(p + "self_attn." + name + ".bias", {rows}, &tmp));
        L.bqkv.insert(L.bqkv.end(), tmp.begin(), tmp.end());
      }
    }
    for (const char* name : {"gate_proj", "up_proj"}) {
      LLM_RETURN_IF_ERROR(w.ReadF32(p + "mlp." + name + ".weight", {inter, h}, &tmp));
      L.w_gate_up.insert(L.w_gate_up.end(), tmp.begin(), tmp.end());
      if (c.mlp_bias) {
        LLM_RETURN_IF_ERROR(w.ReadF32(p + "mlp." + name + ".bias", {inter}, &tmp));
        L.b_gate_up.insert(L.b_gate_up.end(), tmp.begin(), tmp.end());
      }
    }
  }
  return Status::Ok();
}

void LlamaModel::InitRope() {
  inv_freq_ = RopeInvFreq(config_);
}

// Rotates each head of x in the "rotate_half" layout: pairs (i, i + d/2).
void LlamaModel::ApplyRope(float* x, int num_heads, int position) const {
  const int d = config_.head_dim, half = d / 2;
  for (int i = 0; i < half; ++i) {
    const float angle = static_cast<float>(position) * inv_freq_[i];
    const float c = std::cos(angle), s = std::sin(angle);
    for (int h = 0; h < num_heads; ++h) {
      float* xh = x + static_cast<size_t>(h) * d;
      const float x1 = xh[i], x2 = xh[i + half];
      xh[i] = x1 * c - x2 * s;
      xh[i + half] = x2 * c + x1 * s;
    }
  }
}

Status LlamaModel::Forward(const ForwardBatch& batch, std::vector<float>* logits) {
  const ModelConfig& c = config_;
  const int T = static_cast<int>(batch.token_ids.size());
  const int H = c.hidden_size, Q = c.q_size(), KV = c.kv_size(), I = c.intermediate_size;
  const int QKV = Q + 2 * KV;
  LLM_CHECK_EQ(batch.attn.num_tokens, T);
  LLM_CHECK_EQ(static_cast<int>(batch.positions.size()), T);

  std::vector<float> x(static_cast<size_t>(T) * H);      // residual stream [T, H]
  std::vector<float> xn(static_cast<size_t>(T) * H);     // normed
  std::vector<float> qkv(static_cast<size_t>(T) * QKV);  // [T, Q + 2KV]
  std::vector<float> q(static_cast<size_t>(T) * Q), k(static_cast<size_t>(T) * KV),
      v(static_cast<size_t>(T) * KV), attn(static_cast<size_t>(T) * Q);
  std::vector<float> gu(static_cast<size_t>(T) * 2 * I), act(static_cast<size_t>(T) * I);
  std::vector<float> tmp(static_cast<size_t>(T) * H);

  for (int t = 0; t < T; ++t) {
    const int32_t id = batch.token_ids[t];
    if (id < 0 || id >= c.vocab_size) return InvalidArgument("token id out of range");
    std::copy_n(embed_.data() + static_cast<size_t>(id) * H, H,
                x.data() + static_cast<size_t>(t) * H);
  }
  LLM_RETURN_IF_ERROR(CheckAttentionBatch(batch.attn, block_size_, num_blocks_));
  LLM_RETURN_IF_ERROR(attention_->Plan(batch.attn));
  const float scale = c.SoftmaxScale();

  for (int l = 0; l < c.num_layers; ++l) {
    const LlamaLayerWeights& L = layers_[l];
    RmsNorm(x.data(), L.attn_norm.data(), T, H, c.rms_norm_eps, xn.data());
    Linear(xn.data(), L.wqkv.data(), L.bqkv.empty() ? nullptr : L.bqkv.data(), T, QKV, H,
           qkv.data());
    for (int t = 0; t < T; ++t) {
      const float* row = qkv.data() + static_cast<size_t>(t) * QKV;
      float* qt = q.data() + static_cast<size_t>(t) * Q;
      float* kt = k.data() + static_cast<size_t>(t) * KV;
      std::copy_n(row, Q, qt);
      std::copy_n(row + Q, KV, kt);
      std::copy_n(row + Q + KV, KV, v.data() + static_cast<size_t>(t) * KV);
      ApplyRope(qt, c.num_q_heads, batch.positions[t]);
      ApplyRope(kt, c.num_kv_heads, batch.positions[t]);
    }
    if (kv_observer_) kv_observer_(l, T, k.data(), v.data());
    AttentionParams p;
    p.q = q.data();
    p.k_new = k.data();
    p.v_new = v.data();
    p.out = attn.data();
    p.cache.k = k_cache_[l].data();
    p.cache.v = v_cache_[l].data();
    if (!k_scale_.empty()) {
      p.cache.k_scale = k_scale_[l].data();
      p.cache.v_scale = v_scale_[l].data();
    }
    if (!k_block_scales_.empty()) {
      p.cache.k_block_scales = k_block_scales_[l].data();
      p.cache.v_block_scales = v_block_scales_[l].data();
    }
    p.softmax_scale = scale;
    p.window_left = c.WindowLeft(l);
    attention_->Run(p);
    Linear(attn.data(), L.wo.data(), L.bo.empty() ? nullptr : L.bo.data(), T, H, Q, tmp.data());
    for (size_t i = 0; i < x.size(); ++i) x[i] += tmp[i];

    RmsNorm(x.data(), L.mlp_norm.data(), T, H, c.rms_norm_eps, xn.data());
    Linear(xn.data(), L.w_gate_up.data(), L.b_gate_up.empty() ? nullptr : L.b_gate_up.data(), T,
           2 * I, H, gu.data());
    cpu::SiluMul(gu.data(), T, I, act.data());
    Linear(act.data(), L.w_down.data(), L.b_down.empty() ? nullptr : L.b_down.data(), T, H, I,
           tmp.data());
    for (size_t i = 0; i < x.size(); ++i) x[i] += tmp[i];
  }

  // Final norm and LM head only for the rows that sample.
  cpu::FinalLogits(x.data(), batch.logit_rows, final_norm_.data(),
                   (c.tie_word_embeddings ? embed_ : lm_head_).data(), H, c.vocab_size,
                   c.rms_norm_eps, logits);
  return Status::Ok();
}

}  // namespace llm
