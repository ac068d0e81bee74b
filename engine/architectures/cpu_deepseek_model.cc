#include "engine/architectures/cpu_deepseek_model.h"

#include "engine/layers/cpu/cpu_ops.h"
#include "engine/layers/cpu/cpu_weights.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>

#include <spdlog/spdlog.h>

#include "kernels/backend_registry.h"
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

}  // namespace

StatusOr<std::unique_ptr<DeepseekModel>> DeepseekModel::Create(const DeepseekConfig& config,
                                                               const WeightStore& weights,
                                                               const ModelLoadOptions& options) {
  std::unique_ptr<DeepseekModel> m(new DeepseekModel(config));
  LLM_ASSIGN_OR_RETURN(m->cache_dtype_, CacheDType(config, options));
  AttentionSpec spec;
  spec.device = DeviceKind::kCpu;
  spec.kind = AttentionKind::kMla;
  spec.kv_dtype = m->cache_dtype_;
  spec.num_q_heads = config.base.num_q_heads;
  spec.num_kv_heads = 1;
  spec.head_dim = config.latent_dim();
  spec.mla_rope_dim = config.qk_rope_head_dim;
  spec.block_size = options.block_size;
  spec.features = kFeatureCausal;
  std::string table;
  auto backend = BackendRegistry::Global().Create(spec, options.attention_backend, &table);
  spdlog::info("{}", table);
  if (!backend.ok()) return backend.status();  // fail before loading weights or allocating KV
  auto* mla = dynamic_cast<MlaAttentionBackend*>(backend.value().get());
  if (mla == nullptr) {
    return Internal("backend '" + backend.value()->name() +
                    "' registered as MLA does not implement MlaAttentionBackend");
  }
  backend.value().release();
  m->attention_.reset(mla);

  LLM_RETURN_IF_ERROR(m->LoadWeights(weights));
  m->block_size_ = options.block_size;
  m->inv_freq_ = config.RopeInvFreq();
  m->rope_mscale_ = config.RopeMscale();

  const size_t per_block = m->attention_->BlockBytes() * config.base.num_layers;
  m->num_blocks_ = options.num_kv_blocks > 0 ? options.num_kv_blocks
                                             : static_cast<int>(options.kv_cache_bytes / per_block);
  if (m->num_blocks_ < 1) {
    return ResourceExhausted("KV cache budget of " + std::to_string(options.kv_cache_bytes) +
                             " bytes holds no block of " + std::to_string(per_block) + " bytes");
  }
  const size_t layer_bytes = m->attention_->BlockBytes() * m->num_blocks_;
  m->cache_.assign(config.base.num_layers,
                   std::vector<float>((layer_bytes + sizeof(float) - 1) / sizeof(float), 0.0f));
  spdlog::info(
      "DeepSeek MLA latent cache: {} values per token per layer (kv_lora_rank {} + rope {}), {}{}",
      config.latent_dim(), config.kv_lora_rank, config.qk_rope_head_dim, DTypeName(m->cache_dtype_),
      m->cache_dtype_ == DType::kFp8E4M3 ? " with one static scale per layer" : "");
  return m;
}

Status DeepseekModel::LoadWeights(const WeightStore& w) {
  const DeepseekConfig& d = config_;
  const ModelConfig& c = d.base;
  const int64_t h = c.hidden_size, heads = c.num_q_heads;
  const int64_t qk = d.qk_head_dim(), lat = d.latent_dim(), C = d.kv_lora_rank;
  LLM_RETURN_IF_ERROR(ReadEmbeddingAndHead(w, c, &embed_, &lm_head_));
  LLM_RETURN_IF_ERROR(w.ReadF32("model.norm.weight", {h}, &final_norm_));
  const MoeRouting routing = d.Routing();
  MoeTensorNames moe_names;
  if (d.topk_method == DeepseekConfig::TopkMethod::kNoauxTc) {
    moe_names.selection_bias = "e_score_correction_bias";
  }

  layers_.resize(c.num_layers);
  std::vector<float> tmp;
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    const std::string a = p + "self_attn.";
    DeepseekLayerWeights& L = layers_[i];
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

void DeepseekModel::ApplyRope(float* x, int position) const {
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

void DeepseekModel::PrefillAttention(const DeepseekLayerWeights& L, int layer,
                                     const AttentionBatch& batch, int seq, const float* q,
                                     float* attn) const {
  const DeepseekConfig& d = config_;
  const int H = d.base.num_q_heads, N = d.qk_nope_head_dim, R = d.qk_rope_head_dim;
  const int V = d.v_head_dim, C = d.kv_lora_rank, Lw = d.latent_dim(), QK = N + R;
  const int NV = N + V;
  const MlaShape shape{H, C, R, block_size_};
  const int kv_len = batch.kv_lens[seq];
  std::vector<float> lat(static_cast<size_t>(kv_len) * Lw);
  CpuMlaGatherLatents(shape, batch, seq, cache_dtype_, L.cache_scale, cache_[layer].data(),
                      lat.data());
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

Status DeepseekModel::Forward(const ForwardBatch& batch, std::vector<float>* logits) {
  const DeepseekConfig& d = config_;
  const ModelConfig& c = d.base;
  const int T = static_cast<int>(batch.token_ids.size());
  const int Hd = c.hidden_size, H = c.num_q_heads, N = d.qk_nope_head_dim;
  const int R = d.qk_rope_head_dim, V = d.v_head_dim, C = d.kv_lora_rank, Lw = d.latent_dim();
  const int QK = N + R, NV = N + V;
  const int QA = d.q_lora_rank > 0 ? d.q_lora_rank : H * QK;  // q part of the stacked w_a
  const int A = QA + Lw;
  LLM_CHECK_EQ(batch.attn.num_tokens, T);
  LLM_CHECK_EQ(static_cast<int>(batch.positions.size()), T);

  std::vector<float> x(static_cast<size_t>(T) * Hd), xn(x.size()), tmp(x.size());
  std::vector<float> a(static_cast<size_t>(T) * A), q(static_cast<size_t>(T) * H * QK);
  std::vector<float> qa(d.q_lora_rank > 0 ? static_cast<size_t>(T) * d.q_lora_rank : 0);
  std::vector<float> latent(static_cast<size_t>(T) * Lw), attn(static_cast<size_t>(T) * H * V);
  for (int t = 0; t < T; ++t) {
    const int32_t id = batch.token_ids[t];
    if (id < 0 || id >= c.vocab_size) return InvalidArgument("token id out of range");
    std::copy_n(embed_.data() + static_cast<size_t>(id) * Hd, Hd,
                x.data() + static_cast<size_t>(t) * Hd);
  }
  LLM_RETURN_IF_ERROR(CheckAttentionBatch(batch.attn, block_size_, num_blocks_));
  LLM_RETURN_IF_ERROR(attention_->Plan(batch.attn));

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

  for (int l = 0; l < c.num_layers; ++l) {
    const DeepseekLayerWeights& L = layers_[l];
    RmsNorm(x.data(), L.attn_norm.data(), T, Hd, c.rms_norm_eps, xn.data());
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
    p.cache = cache_[l].data();
    p.cache_scale = L.cache_scale;
    p.softmax_scale = scale;
    attention_->RunMla(p);  // appends every row's latent, attends the decode rows
    for (int32_t t : decode_rows) {
      for (int h = 0; h < H; ++h) {
        const float* w_uv = L.w_kv_b.data() + (static_cast<size_t>(h) * NV + N) * C;  // [V, C]
        cblas_sgemv(CblasRowMajor, CblasNoTrans, V, C, 1.0f, w_uv, C,
                    out_latent.data() + (static_cast<size_t>(t) * H + h) * C, 1, 0.0f,
                    attn.data() + (static_cast<size_t>(t) * H + h) * V, 1);
      }
    }
    for (int32_t s : prefill_seqs) PrefillAttention(L, l, batch.attn, s, q.data(), attn.data());

    Linear(attn.data(), L.wo.data(), T, Hd, H * V, tmp.data());
    for (size_t i = 0; i < x.size(); ++i) x[i] += tmp[i];

    RmsNorm(x.data(), L.mlp_norm.data(), T, Hd, c.rms_norm_eps, xn.data());
    if (L.moe) {
      L.moe_block.Forward(xn.data(), T, {routing_trace_, l, batch.positions.data()}, tmp.data());
    } else {
      L.dense.Forward(xn.data(), T, tmp.data());
    }
    for (size_t i = 0; i < x.size(); ++i) x[i] += tmp[i];
  }

  cpu::FinalLogits(x.data(), batch.logit_rows, final_norm_.data(),
                   (c.tie_word_embeddings ? embed_ : lm_head_).data(), Hd, c.vocab_size,
                   c.rms_norm_eps, logits);
  return Status::Ok();
}

}  // namespace llm
