#include "engine/architectures/cpu_dense_decoder.h"

#include <cmath>
#include <vector>

#include "engine/architectures/decoder_spec.h"
#include "engine/layers/cpu/cpu_mlp.h"
#include "engine/layers/cpu/cpu_moe.h"
#include "engine/layers/cpu/cpu_ops.h"
#include "engine/layers/cpu/cpu_weights.h"
#include "engine/layers/mha_attention_spec.h"
#include "engine/loader/kv_cache_quant.h"

namespace llm {
namespace {
using cpu::Linear;
using cpu::RmsNorm;

struct CpuDenseLayer {
  // Norm weights with the spec's norm_weight_offset added; empty where the spec has no norm.
  std::vector<float> attn_in_norm, attn_out_norm, ffn_in_norm, ffn_out_norm;  // [hidden]
  std::vector<float> wqkv;    // [q_size + 2 * kv_size, hidden] (q, k, v stacked)
  std::vector<float> bqkv;    // [q_size + 2 * kv_size] or empty
  std::vector<float> wo;      // [hidden, q_size]
  std::vector<float> bo;      // [hidden] or empty
  std::vector<float> q_norm;  // [head_dim] or empty (qk_norm)
  std::vector<float> k_norm;  // [head_dim] or empty
  std::vector<float> sinks;   // [num_q_heads] learned sink logits, or empty
  CpuMlp mlp;                 // Ffn::kDense
  CpuMoe moe;                 // Ffn::kMoe
};

class CpuDenseDecoder final : public CpuArchitecture {
 public:
  CpuDenseDecoder(const ModelConfig& config, DecoderSpec spec)
      : config_(config), spec_(std::move(spec)) {}

  const ModelConfig& config() const override { return config_; }
  CpuModelSettings settings() const override {
    CpuModelSettings s;
    s.embed_scale = spec_.embed_scale;
    s.norm_weight_offset = spec_.norm_weight_offset;
    s.norm_eps = spec_.rms_norm_eps;
    s.final_logit_softcap = spec_.final_logit_softcap;
    return s;
  }
  StatusOr<AttentionSpec> MakeAttentionSpec(const ModelLoadOptions& options) const override {
    LLM_ASSIGN_OR_RETURN(const KvCacheType kv_type,
                         ParseKvCacheType(options.kv_cache_dtype, options.kv_scale_granularity));
    bool windowed = false;
    for (const DecoderLayerSpec& layer : spec_.layers) windowed |= layer.window_left >= 0;
    return MhaAttentionSpec(config_, kv_type, options.block_size, DeviceKind::kCpu, 0, windowed);
  }
  Status LoadLayers(const WeightStore& weights) override;
  Status RunLayers(const CpuStep& step) const override;
  bool routes_experts() const override {
    for (const DecoderLayerSpec& S : spec_.layers) {
      if (S.ffn == DecoderLayerSpec::Ffn::kMoe) return true;
    }
    return false;
  }

 private:
  // Rotates each head of x in the "rotate_half" layout: pairs (i, i + d/2).
  void ApplyRope(const std::vector<float>& inv_freq, float* x, int num_heads, int position) const;

  ModelConfig config_;
  DecoderSpec spec_;
  std::vector<CpuDenseLayer> layers_;
};

Status CpuDenseDecoder::LoadLayers(const WeightStore& w) {
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
  layers_.resize(c.num_layers);
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    const DecoderLayerSpec& S = spec_.layers[i];
    CpuDenseLayer& L = layers_[i];
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

void CpuDenseDecoder::ApplyRope(const std::vector<float>& inv_freq, float* x, int num_heads,
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

Status CpuDenseDecoder::RunLayers(const CpuStep& step) const {
  const ModelConfig& c = config_;
  const ForwardBatch& batch = *step.batch;
  const int T = step.num_tokens;
  const int H = c.hidden_size, Q = c.q_size(), KV = c.kv_size(), D = c.head_dim;
  const int QKV = Q + 2 * KV;
  const float eps = spec_.rms_norm_eps;
  float* x = step.residual;  // [T, H]
  const size_t x_size = static_cast<size_t>(T) * H;

  std::vector<float> xn(x_size);                         // normed
  std::vector<float> qkv(static_cast<size_t>(T) * QKV);  // [T, Q + 2KV]
  std::vector<float> q(static_cast<size_t>(T) * Q), k(static_cast<size_t>(T) * KV),
      v(static_cast<size_t>(T) * KV), attn(static_cast<size_t>(T) * Q);
  std::vector<float> tmp(x_size);

  // Adds the block output f to the residual stream, through the output norm when there is one.
  auto add_residual = [&](const std::vector<float>& out_norm, std::vector<float>& f) {
    if (!out_norm.empty()) {
      RmsNorm(f.data(), out_norm.data(), T, H, eps, xn.data());
      f.swap(xn);
    }
    for (size_t i = 0; i < x_size; ++i) x[i] += f[i];
  };

  for (int l = 0; l < c.num_layers; ++l) {
    const DecoderLayerSpec& S = spec_.layers[l];
    const CpuDenseLayer& L = layers_[l];
    RmsNorm(x, L.attn_in_norm.data(), T, H, eps, xn.data());
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
    if (step.kv_observer != nullptr) (*step.kv_observer)(l, T, k.data(), v.data());
    AttentionParams p;
    p.q = q.data();
    p.k_new = k.data();
    p.v_new = v.data();
    p.out = attn.data();
    p.cache = step.kv[l];
    p.softmax_scale = S.softmax_scale;
    p.window_left = S.window_left;
    p.logit_softcap = S.logit_softcap;
    p.sink_logits = L.sinks.empty() ? nullptr : L.sinks.data();
    LLM_RETURN_IF_ERROR(step.attention->Run(p));
    Linear(attn.data(), L.wo.data(), L.bo.empty() ? nullptr : L.bo.data(), T, H, Q, tmp.data());
    LLM_RETURN_IF_ERROR(step.AllReduceSum(tmp.data(), x_size));  // a rank's heads: a partial sum
    add_residual(L.attn_out_norm, tmp);

    RmsNorm(x, L.ffn_in_norm.data(), T, H, eps, xn.data());
    switch (S.ffn) {
      case DecoderLayerSpec::Ffn::kDense:
        L.mlp.Forward(xn.data(), T, tmp.data());
        break;
      case DecoderLayerSpec::Ffn::kMoe:
        L.moe.Forward(xn.data(), T, {step.routing_trace, l, batch.positions.data()}, tmp.data());
        break;
    }
    LLM_RETURN_IF_ERROR(step.AllReduceSum(tmp.data(), x_size));
    add_residual(L.ffn_out_norm, tmp);
  }

  return Status::Ok();
}

}  // namespace

StatusOr<std::unique_ptr<CpuArchitecture>> NewCpuDenseDecoder(const ModelConfig& config) {
  LLM_ASSIGN_OR_RETURN(DecoderSpec spec, MakeDecoderSpec(config));
  return std::unique_ptr<CpuArchitecture>(new CpuDenseDecoder(config, std::move(spec)));
}

}  // namespace llm
