#include "engine/architectures/cpu_decoder.h"

#include <cblas.h>

#include <cmath>

#include <spdlog/spdlog.h>

#include "engine/layers/cpu/cpu_ops.h"
#include "engine/layers/cpu/cpu_weights.h"
#include "engine/layers/mha_attention_spec.h"
#include "engine/loader/kv_cache_quant.h"
#include "kernels/backend_registry.h"

namespace llm {
using cpu::Linear;
using cpu::RmsNorm;

StatusOr<std::unique_ptr<CpuDecoder>> CpuDecoder::Create(const ModelConfig& config,
                                                         const WeightStore& weights,
                                                         const ModelLoadOptions& options) {
  LLM_ASSIGN_OR_RETURN(DecoderSpec layers, MakeDecoderSpec(config));
  std::unique_ptr<CpuDecoder> m(new CpuDecoder(config, std::move(layers)));
  LLM_ASSIGN_OR_RETURN(const KvCacheType kv_type,
                       ParseKvCacheType(options.kv_cache_dtype, options.kv_scale_granularity));
  bool windowed = false;
  for (const DecoderLayerSpec& layer : m->spec_.layers) windowed |= layer.window_left >= 0;
  const AttentionSpec spec =
      MhaAttentionSpec(config, kv_type, options.block_size, DeviceKind::kCpu, 0, windowed);
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
                    " bytes per block, not the layout CpuDecoder allocates");
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

Status CpuDecoder::LoadWeights(const WeightStore& w) {
  const ModelConfig& c = config_;
  const int64_t h = c.hidden_size, q = c.q_size(), kv = c.kv_size(), d = c.head_dim;
  const float offset = spec_.norm_weight_offset;
  // A norm of the spec: absent when it names none; else [dim] with the offset added.
  auto read_norm = [&](const std::string& prefix, const std::string& name, int64_t dim,
                       std::vector<float>* out) -> Status {
    out->clear();
    if (name.empty()) return Status::Ok();
    LLM_RETURN_IF_ERROR(w.ReadF32(prefix + name + ".weight", {dim}, out));
    for (float& x : *out) x += offset;
    return Status::Ok();
  };
  LLM_RETURN_IF_ERROR(ReadEmbeddingAndHead(w, c, &embed_, &lm_head_));
  LLM_RETURN_IF_ERROR(read_norm("model.", "norm", h, &final_norm_));
  layers_.resize(c.num_layers);
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    const DecoderLayerSpec& S = spec_.layers[i];
    CpuDecoderLayer& L = layers_[i];
    LLM_RETURN_IF_ERROR(read_norm(p, S.attn_in_norm, h, &L.attn_in_norm));
    LLM_RETURN_IF_ERROR(read_norm(p, S.attn_out_norm, h, &L.attn_out_norm));
    LLM_RETURN_IF_ERROR(read_norm(p, S.ffn_in_norm, h, &L.ffn_in_norm));
    LLM_RETURN_IF_ERROR(read_norm(p, S.ffn_out_norm, h, &L.ffn_out_norm));
    const std::string a = p + "self_attn.";
    const StackedPart qkv[] = {{"q_proj", q}, {"k_proj", kv}, {"v_proj", kv}};
    LLM_RETURN_IF_ERROR(ReadStacked(w, a, qkv, h, S.qkv_bias, &L.wqkv, &L.bqkv));
    LLM_RETURN_IF_ERROR(w.ReadF32(a + "o_proj.weight", {h, q}, &L.wo));
    if (S.o_bias) LLM_RETURN_IF_ERROR(w.ReadF32(a + "o_proj.bias", {h}, &L.bo));
    if (S.qk_norm) {
      LLM_RETURN_IF_ERROR(read_norm(a, "q_norm", d, &L.q_norm));
      LLM_RETURN_IF_ERROR(read_norm(a, "k_norm", d, &L.k_norm));
    }
    L.sinks.clear();
    if (S.sinks) LLM_RETURN_IF_ERROR(w.ReadF32(a + "sinks", {c.num_q_heads}, &L.sinks));
    switch (S.ffn) {
      case DecoderLayerSpec::Ffn::kDense:
        LLM_RETURN_IF_ERROR(ReadCpuMlp(w, p + S.mlp_prefix, S.mlp_names, c.hidden_size,
                                       S.intermediate, S.mlp_bias, &L.mlp, S.gate));
        break;
      case DecoderLayerSpec::Ffn::kMoe:
        LLM_RETURN_IF_ERROR(ReadCpuMoe(w, p, S.moe_names, S.routing, c.hidden_size,
                                       S.moe_intermediate, S.shared_intermediate, &L.moe, S.gate));
        break;
    }
  }
  return Status::Ok();
}

bool CpuDecoder::set_routing_trace(std::vector<MoeRoutingDecision>* trace) {
  routing_trace_ = trace;
  for (const DecoderLayerSpec& S : spec_.layers) {
    if (S.ffn == DecoderLayerSpec::Ffn::kMoe) return true;
  }
  routing_trace_ = nullptr;
  return false;
}

void CpuDecoder::ApplyRope(const std::vector<float>& inv_freq, float* x, int num_heads,
                           int position) const {
  const int d = config_.head_dim, half = d / 2;
  for (int i = 0; i < half; ++i) {
    const float angle = static_cast<float>(position) * inv_freq[i];
    const float c = std::cos(angle), s = std::sin(angle);
    for (int h = 0; h < num_heads; ++h) {
      float* xh = x + static_cast<size_t>(h) * d;
      const float x1 = xh[i], x2 = xh[i + half];
      xh[i] = x1 * c - x2 * s;
      xh[i + half] = x2 * c + x1 * s;
    }
  }
}

Status CpuDecoder::Forward(const ForwardBatch& batch, std::vector<float>* logits) {
  const ModelConfig& c = config_;
  const int T = static_cast<int>(batch.token_ids.size());
  const int H = c.hidden_size, Q = c.q_size(), KV = c.kv_size(), D = c.head_dim;
  const int QKV = Q + 2 * KV;
  const float eps = spec_.rms_norm_eps;
  LLM_CHECK_EQ(batch.attn.num_tokens, T);
  LLM_CHECK_EQ(static_cast<int>(batch.positions.size()), T);

  std::vector<float> x(static_cast<size_t>(T) * H);      // residual stream [T, H]
  std::vector<float> xn(static_cast<size_t>(T) * H);     // normed
  std::vector<float> qkv(static_cast<size_t>(T) * QKV);  // [T, Q + 2KV]
  std::vector<float> q(static_cast<size_t>(T) * Q), k(static_cast<size_t>(T) * KV),
      v(static_cast<size_t>(T) * KV), attn(static_cast<size_t>(T) * Q);
  std::vector<float> tmp(static_cast<size_t>(T) * H);

  for (int t = 0; t < T; ++t) {
    const int32_t id = batch.token_ids[t];
    if (id < 0 || id >= c.vocab_size) return InvalidArgument("token id out of range");
    float* xt = x.data() + static_cast<size_t>(t) * H;
    std::copy_n(embed_.data() + static_cast<size_t>(id) * H, H, xt);
    if (spec_.embed_scale != 1.0f) {
      for (int i = 0; i < H; ++i) xt[i] *= spec_.embed_scale;
    }
  }
  LLM_RETURN_IF_ERROR(CheckAttentionBatch(batch.attn, block_size_, num_blocks_));
  LLM_RETURN_IF_ERROR(attention_->Plan(batch.attn));
  // Adds the block output f to the residual stream, through the output norm when there is one.
  auto add_residual = [&](const std::vector<float>& out_norm, std::vector<float>& f) {
    if (!out_norm.empty()) {
      RmsNorm(f.data(), out_norm.data(), T, H, eps, xn.data());
      f.swap(xn);
    }
    for (size_t i = 0; i < x.size(); ++i) x[i] += f[i];
  };

  for (int l = 0; l < c.num_layers; ++l) {
    const DecoderLayerSpec& S = spec_.layers[l];
    const CpuDecoderLayer& L = layers_[l];
    RmsNorm(x.data(), L.attn_in_norm.data(), T, H, eps, xn.data());
    Linear(xn.data(), L.wqkv.data(), L.bqkv.empty() ? nullptr : L.bqkv.data(), T, QKV, H,
           qkv.data());
    for (int t = 0; t < T; ++t) {
      const float* row = qkv.data() + static_cast<size_t>(t) * QKV;
      float* qt = q.data() + static_cast<size_t>(t) * Q;
      float* kt = k.data() + static_cast<size_t>(t) * KV;
      std::copy_n(row, Q, qt);
      std::copy_n(row + Q, KV, kt);
      std::copy_n(row + Q + KV, KV, v.data() + static_cast<size_t>(t) * KV);
      if (!L.q_norm.empty()) {  // per head, before rotary; in place is safe row by row
        RmsNorm(qt, L.q_norm.data(), c.num_q_heads, D, eps, qt);
        RmsNorm(kt, L.k_norm.data(), c.num_kv_heads, D, eps, kt);
      }
      ApplyRope(S.inv_freq, qt, c.num_q_heads, batch.positions[t]);
      ApplyRope(S.inv_freq, kt, c.num_kv_heads, batch.positions[t]);
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
    p.softmax_scale = S.softmax_scale;
    p.window_left = S.window_left;
    p.logit_softcap = S.logit_softcap;
    p.sink_logits = L.sinks.empty() ? nullptr : L.sinks.data();
    attention_->Run(p);
    Linear(attn.data(), L.wo.data(), L.bo.empty() ? nullptr : L.bo.data(), T, H, Q, tmp.data());
    add_residual(L.attn_out_norm, tmp);

    RmsNorm(x.data(), L.ffn_in_norm.data(), T, H, eps, xn.data());
    switch (S.ffn) {
      case DecoderLayerSpec::Ffn::kDense:
        L.mlp.Forward(xn.data(), T, tmp.data());
        break;
      case DecoderLayerSpec::Ffn::kMoe:
        L.moe.Forward(xn.data(), T, {routing_trace_, l, batch.positions.data()}, tmp.data());
        break;
    }
    add_residual(L.ffn_out_norm, tmp);
  }

  // Final norm and LM head only for the rows that sample.
  cpu::FinalLogits(x.data(), batch.logit_rows, final_norm_.data(),
                   (c.tie_word_embeddings ? embed_ : lm_head_).data(), H, c.vocab_size, eps,
                   logits);
  if (const float cap = spec_.final_logit_softcap; cap > 0.0f) {
    for (float& v : *logits) v = cap * std::tanh(v / cap);
  }
  return Status::Ok();
}

}  // namespace llm
