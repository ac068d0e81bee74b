// DeepSeek-V2 / DeepSeek-V3 decoder (DeepseekV2ForCausalLM, DeepseekV3ForCausalLM) on the CPU:
// multi-head latent attention over a paged latent cache, DeepSeekMoE feed-forward layers.
//
// Attention per layer (HF modeling_deepseek.py semantics):
//   q      = q_b_proj(RMSNorm_1e-6(q_a_proj(x)))  or  q_proj(x)     -> [H, qk_nope + qk_rope]
//   kv_a   = kv_a_proj_with_mqa(x) -> c_kv [kv_lora_rank] ++ k_pe [qk_rope]
//   latent = RMSNorm_1e-6(c_kv) ++ rope(k_pe)      <- the only thing cached per token
//   k_nope, v per head = kv_b_proj(latent c part)   (W_UK, W_UV rows of kv_b_proj)
// Rope is HF DeepSeek's: the (d/2, 2) pairs are de-interleaved before rotate_half, so rope(x)
// gives [x0 c - x1 s, x2 c - x3 s, ..., x1 c + x0 s, x3 c + x2 s, ...] * mscale; q_pe and the
// cached k_pe both use that output layout.
// Decode sequences (1..kMlaMaxDecodeQueryLen query rows) attend in the absorbed form through the
// MLA backend (q_latent = W_UK^T q_nope, output W_UV * out_latent); longer ones (prefill chunks)
// expand the sequence's cached latents to full heads here. Both read the latents from the cache,
// so an fp8 cache affects them alike.
//
// Latent cache dtype: ModelLoadOptions::kv_cache_dtype "fp8_e4m3" or, with "auto", config.json's
// `mla_cache_dtype` (default fp32). fp8 uses one static dequant scale per layer: the checkpoint
// scalar `model.layers.N.self_attn.kv_scale` when present, else config `mla_cache_scale` (1.0).
// Other kv_cache_dtype values (int8, fp8_e4m3_dynamic) and kv_scales_file are rejected with
// InvalidArgument; kv_scale_granularity does not apply (one scalar per layer).
#pragma once

#include <memory>
#include <vector>

#include "engine/layers/cpu/cpu_moe.h"
#include "engine/loader/deepseek_config.h"
#include "engine/loader/safetensors.h"
#include "engine/runtime/model.h"

namespace llm {

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

class DeepseekModel final : public Model {
 public:
  static StatusOr<std::unique_ptr<DeepseekModel>> Create(const DeepseekConfig& config,
                                                         const WeightStore& weights,
                                                         const ModelLoadOptions& options);

  const ModelConfig& config() const override { return config_.base; }
  const DeepseekConfig& deepseek_config() const { return config_; }
  Status Forward(const ForwardBatch& batch, std::vector<float>* logits) override;
  std::string attention_backend_name() const override { return attention_->name(); }
  int num_kv_blocks() const override { return num_blocks_; }
  size_t kv_bytes_per_block() const override {
    return attention_->BlockBytes() * config_.base.num_layers;
  }
  DType cache_dtype() const { return cache_dtype_; }
  // Records every routing decision with its margin (moe_router.h).
  bool set_routing_trace(std::vector<MoeRoutingDecision>* trace) override {
    routing_trace_ = trace;
    return true;
  }

 private:
  explicit DeepseekModel(const DeepseekConfig& config) : config_(config) {}
  Status LoadWeights(const WeightStore& weights);
  // DeepSeek rope on one [rope_dim] vector in place (see the file comment).
  void ApplyRope(float* x, int position) const;
  // Expanded-heads attention of one prefill sequence; writes its rows of attn [T, H * v_head].
  void PrefillAttention(const DeepseekLayerWeights& L, int layer, const AttentionBatch& batch,
                        int seq, const float* q, float* attn) const;

  DeepseekConfig config_;
  std::vector<float> embed_;    // [vocab, hidden]
  std::vector<float> lm_head_;  // [vocab, hidden]; empty when tied
  std::vector<float> final_norm_;
  std::vector<DeepseekLayerWeights> layers_;
  std::vector<float> inv_freq_;  // [qk_rope / 2]
  float rope_mscale_ = 1.0f;

  std::unique_ptr<MlaAttentionBackend> attention_;
  DType cache_dtype_ = DType::kF32;
  int block_size_ = 0;
  int num_blocks_ = 0;
  std::vector<std::vector<float>> cache_;  // per layer [blocks, block_size, L] (fp8: the bytes)
  std::vector<MoeRoutingDecision>* routing_trace_ = nullptr;  // set_routing_trace; not owned
};

}  // namespace llm
