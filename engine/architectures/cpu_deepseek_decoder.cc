#include "engine/architectures/cpu_deepseek_decoder.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/layers/cpu/cpu_mlp.h"
#include "engine/layers/cpu/cpu_moe.h"
#include "engine/layers/cpu/cpu_ops.h"
#include "kernels/cpu/cpu_mla_attention.h"

namespace llm {
namespace {

// HF DeepSeek builds q_a_layernorm and kv_a_layernorm with the RMSNorm default eps, not
// config.rms_norm_eps.
constexpr float kLatentNormEps = 1e-6f;

// y[M, N] = x[M, K] @ w[N, K]^T.
void Linear(const float* x, const float* w, int m, int n, int k, float* y) {
  cpu::Linear(x, w, nullptr, m, n, k, y);
}
using cpu::RmsNorm;

StatusOr<DType> CacheDType(const DeepseekConfig& config, const ModelLoadOptions& options) {
  if (!options.kv_scales_file.empty()) {
    return InvalidArgument(
        "kv_scales_file is not supported for MLA models: the fp8 latent cache scale comes from "
        "model.layers.N.self_attn.kv_scale or config.json mla_cache_scale");
  }
  const std::string& t = options.kv_cache_dtype;
  if (t.empty() || t == "auto") return config.mla_cache_dtype;
  if (t == "float32" || t == "fp32") return DType::kF32;
  if (t == "fp8_e4m3") return DType::kFp8E4M3;
  return InvalidArgument("kv_cache_dtype '" + t +
                         "' is not supported for MLA (DeepSeek) models: use auto, float32 or "
                         "fp8_e4m3 (one static scale per layer)");
}

struct DeepseekLayerWeights {
  std::vector<float> attn_norm;  // [hidden]
  std::vector<float> mlp_norm;   // [hidden]
  // q_a_proj (q LoRA) or q_proj rows, stacked over kv_a_proj_with_mqa rows: [qa + L, hidden].
  std::vector<float> w_a;
  std::vector<float> q_a_norm;   // [q_lora_rank] (q LoRA only)
  std::vector<float> w_q_b;      // [H * qk_head_dim, q_lora_rank] (q LoRA only)
  std::vector<float> kv_a_norm;  // [kv_lora_rank]
  std::vector<float> w_kv_b;     // [H * (qk_nope + v_head), kv_lora_rank]
  std::vector<float> wo;         // [hidden, H * v_head]
  float cache_scale = 1.0f;      // fp8 latent cache dequant scale

  bool moe = false;
  CpuMlp dense;  // dense layers (intermediate_size)
  // MoE layers: routed experts of moe_intermediate_size, shared experts of n_shared_experts *
  // moe_intermediate_size, noaux_tc's e_score_correction_bias as the selection bias.
  CpuMoe moe_block;
};

class CpuDeepseekDecoder final : public CpuArchitecture {
 public:
  CpuDeepseekDecoder(const DeepseekConfig& config, int first_layer, int num_layers)
      : config_(config),
        first_layer_(first_layer),
        num_layers_(num_layers),
        inv_freq_(config.RopeInvFreq()),
        rope_mscale_(config.RopeMscale()) {}

  const ModelConfig& config() const override { return config_.base; }
  CpuModelSettings settings() const override {
    CpuModelSettings s;
    s.norm_eps = config_.base.rms_norm_eps;
    return s;
  }
  StatusOr<AttentionSpec> MakeAttentionSpec(const ModelLoadOptions& options) const override;
  Status LoadLayers(const WeightStore& weights) override;
  Status RunLayers(const CpuStep& step) const override;
  // True for every DeepSeek config, as before the runner: one without routed experts records
  // nothing.
  bool routes_experts() const override { return true; }
  std::string CacheSummary(const AttentionSpec& spec) const override;

 private:
  // DeepSeek rope on one [rope_dim] vector in place (see the file comment).
  void ApplyRope(float* x, int position) const;
  // Expanded-heads attention of one prefill sequence; writes its rows of attn [T, H * v_head].
  void PrefillAttention(const DeepseekLayerWeights& L, const AttentionSpec& spec, const void* cache,
                        const AttentionBatch& batch, int seq, const float* q, float* attn) const;

  DeepseekConfig config_;
  // The checkpoint layers [first_layer_, first_layer_ + num_layers_) this definition computes
  // (the model's, or an MTP layer's decoder layer), with caches step.kv[0 .. num_layers_).
  int first_layer_ = 0;
  int num_layers_ = 0;
  std::vector<float> inv_freq_;  // [qk_rope / 2]
  float rope_mscale_ = 1.0f;
  std::vector<DeepseekLayerWeights> layers_;
};

StatusOr<AttentionSpec> CpuDeepseekDecoder::MakeAttentionSpec(
    const ModelLoadOptions& options) const {
  LLM_ASSIGN_OR_RETURN(const DType cache_dtype, CacheDType(config_, options));
  AttentionSpec spec;
  spec.device = DeviceKind::kCpu;
  spec.kind = AttentionKind::kMla;
  spec.kv_dtype = cache_dtype;
  spec.num_q_heads = config_.base.num_q_heads;
  spec.num_kv_heads = 1;
  spec.head_dim = config_.latent_dim();
  spec.mla_rope_dim = config_.qk_rope_head_dim;
  spec.block_size = options.block_size;
  spec.features = kFeatureCausal;
  return spec;
}

std::string CpuDeepseekDecoder::CacheSummary(const AttentionSpec& spec) const {
  return "DeepSeek MLA latent cache: " + std::to_string(config_.latent_dim()) +
         " values per token per layer (kv_lora_rank " + std::to_string(config_.kv_lora_rank) +
         " + rope " + std::to_string(config_.qk_rope_head_dim) + "), " + DTypeName(spec.kv_dtype) +
         (spec.kv_dtype == DType::kFp8E4M3 ? " with one static scale per layer" : "");
}

Status CpuDeepseekDecoder::LoadLayers(const WeightStore& w) {
  const DeepseekConfig& d = config_;
  const ModelConfig& c = d.base;
  const int64_t h = c.hidden_size, heads = c.num_q_heads;
  const int64_t qk = d.qk_head_dim(), lat = d.latent_dim(), C = d.kv_lora_rank;
  const MoeRouting routing = d.Routing();
  MoeTensorNames moe_names;
  if (d.topk_method == DeepseekConfig::TopkMethod::kNoauxTc) {
    moe_names.selection_bias = "e_score_correction_bias";
  }

  layers_.resize(num_layers_);
  std::vector<float> tmp;
  for (int l = 0; l < num_layers_; ++l) {
    const int i = first_layer_ + l;  // the checkpoint's layer index
    const std::string p = "model.layers." + std::to_string(i) + ".";
    const std::string a = p + "self_attn.";
    DeepseekLayerWeights& L = layers_[l];
    LLM_RETURN_IF_ERROR(w.ReadF32(p + "input_layernorm.weight", {h}, &L.attn_norm));
    LLM_RETURN_IF_ERROR(w.ReadF32(p + "post_attention_layernorm.weight", {h}, &L.mlp_norm));
    if (d.q_lora_rank > 0) {
      LLM_RETURN_IF_ERROR(w.ReadF32(a + "q_a_proj.weight", {d.q_lora_rank, h}, &L.w_a));
      LLM_RETURN_IF_ERROR(w.ReadF32(a + "q_a_layernorm.weight", {d.q_lora_rank}, &L.q_a_norm));
      LLM_RETURN_IF_ERROR(w.ReadF32(a + "q_b_proj.weight", {heads * qk, d.q_lora_rank}, &L.w_q_b));
    } else {
      LLM_RETURN_IF_ERROR(w.ReadF32(a + "q_proj.weight", {heads * qk, h}, &L.w_a));
    }
    LLM_RETURN_IF_ERROR(w.ReadF32(a + "kv_a_proj_with_mqa.weight", {lat, h}, &tmp));
    L.w_a.insert(L.w_a.end(), tmp.begin(), tmp.end());
    LLM_RETURN_IF_ERROR(w.ReadF32(a + "kv_a_layernorm.weight", {C}, &L.kv_a_norm));
    LLM_RETURN_IF_ERROR(w.ReadF32(a + "kv_b_proj.weight",
                                  {heads * (d.qk_nope_head_dim + d.v_head_dim), C}, &L.w_kv_b));
    LLM_RETURN_IF_ERROR(w.ReadF32(a + "o_proj.weight", {h, heads * d.v_head_dim}, &L.wo));

    L.cache_scale = d.mla_cache_scale;
    if (w.Has(a + "kv_scale")) {
      LLM_ASSIGN_OR_RETURN(const TensorView* t, w.Get(a + "kv_scale"));
      if (t->numel() != 1 || t->dtype == DType::kI8 || t->dtype == DType::kFp8E4M3) {
        return InvalidArgument("tensor '" + a + "kv_scale' must be one float, got " +
                               DTypeName(t->dtype) + " " + t->ShapeString());
      }
      ConvertToF32(t->dtype, t->data, &L.cache_scale, 1);
      if (!(L.cache_scale > 0.0f) || !std::isfinite(L.cache_scale)) {
        return InvalidArgument("tensor '" + a + "kv_scale' must be positive and finite");
      }
    }

    L.moe = d.IsMoeLayer(i);
    if (!L.moe) {
      LLM_RETURN_IF_ERROR(ReadCpuMlp(w, p + "mlp.", MlpTensorNames(), c.hidden_size,
                                     c.intermediate_size, false, &L.dense));
      continue;
    }
    LLM_RETURN_IF_ERROR(ReadCpuMoe(w, p, moe_names, routing, c.hidden_size, d.moe_intermediate_size,
                                   d.moe_intermediate_size * d.n_shared_experts, &L.moe_block));
  }
  return Status::Ok();
}

void CpuDeepseekDecoder::ApplyRope(float* x, int position) const {
  const int half = config_.qk_rope_head_dim / 2;
  float in[kMaxRopeDim];
  std::copy_n(x, 2 * half, in);
  for (int i = 0; i < half; ++i) {
    const float angle = static_cast<float>(position) * inv_freq_[i];
    const float c = std::cos(angle) * rope_mscale_, s = std::sin(angle) * rope_mscale_;
    const float x0 = in[2 * i], x1 = in[2 * i + 1];
    x[i] = x0 * c - x1 * s;
    x[i + half] = x1 * c + x0 * s;
  }
}

void CpuDeepseekDecoder::PrefillAttention(const DeepseekLayerWeights& L, const AttentionSpec& spec,
                                          const void* cache, const AttentionBatch& batch, int seq,
                                          const float* q, float* attn) const {
  const DeepseekConfig& d = config_;
  const int H = d.base.num_q_heads, N = d.qk_nope_head_dim, R = d.qk_rope_head_dim;
  const int V = d.v_head_dim, C = d.kv_lora_rank, Lw = d.latent_dim(), QK = N + R;
  const int NV = N + V;
  const MlaShape shape{H, C, R, spec.block_size};
  const int kv_len = batch.kv_lens[seq];
  std::vector<float> lat(static_cast<size_t>(kv_len) * Lw);
  CpuMlaGatherLatents(shape, batch, seq, spec.kv_dtype, L.cache_scale, cache, lat.data());
  // Expand: per cached token and head, k_nope = W_UK c and v = W_UV c.
  std::vector<float> kv(static_cast<size_t>(kv_len) * H * NV);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, kv_len, H * NV, C, 1.0f, lat.data(), Lw,
              L.w_kv_b.data(), C, 0.0f, kv.data(), H * NV);
  const float scale = d.SoftmaxScale();
  const int q_begin = batch.q_indptr[seq], q_end = batch.q_indptr[seq + 1];
  std::vector<float> scores(kv_len), acc(V);
  for (int t = q_begin; t < q_end; ++t) {
    const int pos = kv_len - (q_end - t);
    for (int h = 0; h < H; ++h) {
      const float* qn = q + (static_cast<size_t>(t) * H + h) * QK;
      const float* qp = qn + N;
      float mx = -INFINITY;
      for (int j = 0; j <= pos; ++j) {
        const float* k = kv.data() + (static_cast<size_t>(j) * H + h) * NV;
        const float* kp = lat.data() + static_cast<size_t>(j) * Lw + C;
        float dot = 0.0f;
        for (int i = 0; i < N; ++i) dot += qn[i] * k[i];
        for (int i = 0; i < R; ++i) dot += qp[i] * kp[i];
        scores[j] = dot * scale;
        mx = std::max(mx, scores[j]);
      }
      float sum = 0.0f;
      for (int j = 0; j <= pos; ++j) sum += (scores[j] = std::exp(scores[j] - mx));
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int j = 0; j <= pos; ++j) {
        const float* vv = kv.data() + (static_cast<size_t>(j) * H + h) * NV + N;
        for (int i = 0; i < V; ++i) acc[i] += scores[j] * vv[i];
      }
      float* o = attn + (static_cast<size_t>(t) * H + h) * V;
      for (int i = 0; i < V; ++i) o[i] = acc[i] / sum;
    }
  }
}

Status CpuDeepseekDecoder::RunLayers(const CpuStep& step) const {
  const DeepseekConfig& d = config_;
  const ModelConfig& c = d.base;
  const ForwardBatch& batch = *step.batch;
  const int T = step.num_tokens;
  const int Hd = c.hidden_size, H = c.num_q_heads, N = d.qk_nope_head_dim;
  const int R = d.qk_rope_head_dim, V = d.v_head_dim, C = d.kv_lora_rank, Lw = d.latent_dim();
  const int QK = N + R, NV = N + V;
  const int QA = d.q_lora_rank > 0 ? d.q_lora_rank : H * QK;  // q part of the stacked w_a
  const int A = QA + Lw;
  float* x = step.residual;  // [T, Hd]
  const size_t x_size = static_cast<size_t>(T) * Hd;

  std::vector<float> xn(x_size), tmp(x_size);
  std::vector<float> a(static_cast<size_t>(T) * A), q(static_cast<size_t>(T) * H * QK);
  std::vector<float> qa(d.q_lora_rank > 0 ? static_cast<size_t>(T) * d.q_lora_rank : 0);
  std::vector<float> latent(static_cast<size_t>(T) * Lw), attn(static_cast<size_t>(T) * H * V);

  // Decode sequences go through the MLA backend (absorbed); the rest are expanded here.
  const std::vector<int32_t> decode_seqs = MlaDecodeSeqs(batch.attn);
  std::vector<int32_t> decode_rows, prefill_seqs;
  {
    std::vector<char> is_decode(batch.attn.num_seqs, 0);
    for (int32_t s : decode_seqs) is_decode[s] = 1;
    for (int s = 0; s < batch.attn.num_seqs; ++s) {
      if (!is_decode[s]) {
        prefill_seqs.push_back(s);
        continue;
      }
      for (int t = batch.attn.q_indptr[s]; t < batch.attn.q_indptr[s + 1]; ++t) {
        decode_rows.push_back(t);
      }
    }
  }
  std::vector<float> q_latent, q_pe, out_latent;
  if (!decode_rows.empty()) {
    q_latent.assign(static_cast<size_t>(T) * H * C, 0.0f);
    out_latent.assign(q_latent.size(), 0.0f);
    q_pe.assign(static_cast<size_t>(T) * H * R, 0.0f);
  }
  const float scale = d.SoftmaxScale();

  for (int l = 0; l < num_layers_; ++l) {
    const DeepseekLayerWeights& L = layers_[l];
    RmsNorm(x, L.attn_norm.data(), T, Hd, c.rms_norm_eps, xn.data());
    Linear(xn.data(), L.w_a.data(), T, A, Hd, a.data());
    for (int t = 0; t < T; ++t) {
      const float* at = a.data() + static_cast<size_t>(t) * A;
      if (d.q_lora_rank > 0) {
        RmsNorm(at, L.q_a_norm.data(), 1, d.q_lora_rank, kLatentNormEps,
                qa.data() + static_cast<size_t>(t) * d.q_lora_rank);
      } else {
        std::copy_n(at, QA, q.data() + static_cast<size_t>(t) * H * QK);
      }
      float* lt = latent.data() + static_cast<size_t>(t) * Lw;
      RmsNorm(at + QA, L.kv_a_norm.data(), 1, C, kLatentNormEps, lt);
      std::copy_n(at + QA + C, R, lt + C);
      ApplyRope(lt + C, batch.positions[t]);
    }
    if (d.q_lora_rank > 0) Linear(qa.data(), L.w_q_b.data(), T, H * QK, d.q_lora_rank, q.data());
    for (int t = 0; t < T; ++t) {
      for (int h = 0; h < H; ++h) {
        ApplyRope(q.data() + (static_cast<size_t>(t) * H + h) * QK + N, batch.positions[t]);
      }
    }

    // Absorbed decode: q_latent[t, h] = W_UK_h^T q_nope[t, h]; W_UK_h is [N, C] inside kv_b_proj.
    for (int32_t t : decode_rows) {
      for (int h = 0; h < H; ++h) {
        const float* qh = q.data() + (static_cast<size_t>(t) * H + h) * QK;
        const float* w_uk = L.w_kv_b.data() + static_cast<size_t>(h) * NV * C;
        cblas_sgemv(CblasRowMajor, CblasTrans, N, C, 1.0f, w_uk, C, qh, 1, 0.0f,
                    q_latent.data() + (static_cast<size_t>(t) * H + h) * C, 1);
        std::copy_n(qh + N, R, q_pe.data() + (static_cast<size_t>(t) * H + h) * R);
      }
    }
    MlaParams p;
    p.q_latent = q_latent.data();
    p.q_pe = q_pe.data();
    p.latent_new = latent.data();
    p.out_latent = out_latent.data();
    p.cache = step.kv[l].k;
    p.cache_scale = L.cache_scale;
    p.softmax_scale = scale;
    LLM_RETURN_IF_ERROR(step.mla->RunMla(p));  // appends every row's latent, attends decode rows
    for (int32_t t : decode_rows) {
      for (int h = 0; h < H; ++h) {
        const float* w_uv = L.w_kv_b.data() + (static_cast<size_t>(h) * NV + N) * C;  // [V, C]
        cblas_sgemv(CblasRowMajor, CblasNoTrans, V, C, 1.0f, w_uv, C,
                    out_latent.data() + (static_cast<size_t>(t) * H + h) * C, 1, 0.0f,
                    attn.data() + (static_cast<size_t>(t) * H + h) * V, 1);
      }
    }
    for (int32_t s : prefill_seqs)
      PrefillAttention(L, *step.spec, step.kv[l].k, batch.attn, s, q.data(), attn.data());

    Linear(attn.data(), L.wo.data(), T, Hd, H * V, tmp.data());
    LLM_RETURN_IF_ERROR(step.AllReduceSum(tmp.data(), x_size));  // a rank's heads: a partial sum
    for (size_t i = 0; i < x_size; ++i) x[i] += tmp[i];

    RmsNorm(x, L.mlp_norm.data(), T, Hd, c.rms_norm_eps, xn.data());
    if (L.moe) {
      L.moe_block.Forward(xn.data(), T, {step.routing_trace, l, batch.positions.data()},
                          tmp.data());
    } else {
      L.dense.Forward(xn.data(), T, tmp.data());
    }
    LLM_RETURN_IF_ERROR(step.AllReduceSum(tmp.data(), x_size));
    for (size_t i = 0; i < x_size; ++i) x[i] += tmp[i];
  }

  return Status::Ok();
}

}  // namespace

std::unique_ptr<CpuArchitecture> NewCpuDeepseekDecoder(const DeepseekConfig& config) {
  return std::make_unique<CpuDeepseekDecoder>(config, 0, config.base.num_layers);
}

std::unique_ptr<CpuArchitecture> NewCpuDeepseekLayers(const DeepseekConfig& config, int first_layer,
                                                      int num_layers) {
  return std::make_unique<CpuDeepseekDecoder>(config, first_layer, num_layers);
}

}  // namespace llm
