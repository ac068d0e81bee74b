// The decoder-only transformer on the CPU (the numerical oracle) for every architecture with
// per-head K/V attention: fp32 weights, OpenBLAS matrix products, paged KV through the selected
// attention backend. What differs between architectures is data, their layer definition
// (decoder_spec.h): Llama, Mistral, Qwen2/3, Qwen3-MoE, Mixtral, Gemma 2/3 and gpt-oss. DeepSeek's
// latent attention is DeepseekModel.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "engine/architectures/decoder_spec.h"
#include "engine/layers/cpu/cpu_mlp.h"
#include "engine/layers/cpu/cpu_moe.h"
#include "engine/loader/safetensors.h"
#include "engine/runtime/model.h"

namespace llm {

struct CpuDecoderLayer {
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

class CpuDecoder final : public Model {
 public:
  static StatusOr<std::unique_ptr<CpuDecoder>> Create(const ModelConfig& config,
                                                      const WeightStore& weights,
                                                      const ModelLoadOptions& options);

  const ModelConfig& config() const override { return config_; }
  Status Forward(const ForwardBatch& batch, std::vector<float>* logits) override;
  std::string attention_backend_name() const override { return attention_->name(); }
  int num_kv_blocks() const override { return num_blocks_; }
  size_t kv_bytes_per_block() const override {
    return attention_->BlockBytes() * config_.num_layers;
  }
  // Records every MoE routing decision with its margin (moe_router.h); false without MoE layers.
  bool set_routing_trace(std::vector<MoeRoutingDecision>* trace) override;

  // Sees every layer's new K (after RoPE, as the cache stores it) and V, [num_tokens,
  // num_kv_heads, head_dim] fp32, right before the attention backend appends them. Calibration
  // (llm-calibrate-kv) records absmax through it. Empty function: none.
  using KvObserver = std::function<void(int layer, int num_tokens, const float* k, const float* v)>;
  void set_kv_observer(KvObserver observer) { kv_observer_ = std::move(observer); }

 private:
  CpuDecoder(const ModelConfig& config, DecoderSpec spec)
      : config_(config), spec_(std::move(spec)) {}
  Status LoadWeights(const WeightStore& weights);
  // Rotates each head of x in the "rotate_half" layout: pairs (i, i + d/2).
  void ApplyRope(const std::vector<float>& inv_freq, float* x, int num_heads, int position) const;

  ModelConfig config_;
  DecoderSpec spec_;
  std::vector<float> embed_;    // [vocab, hidden]
  std::vector<float> lm_head_;  // [vocab, hidden]; empty when tied to embed_
  std::vector<float> final_norm_;
  std::vector<CpuDecoderLayer> layers_;

  std::unique_ptr<AttentionBackend> attention_;
  int block_size_ = 0;
  int num_blocks_ = 0;
  // Per layer [blocks, kv_heads, bs, d] of the spec's kv dtype (8-bit caches use the bytes).
  std::vector<std::vector<float>> k_cache_, v_cache_;
  // 8-bit caches: static dequant scales per layer ([kv_heads] or [kv_heads * d]), or dynamic
  // per-token scales per layer ([blocks, kv_heads, bs]); empty otherwise.
  std::vector<std::vector<float>> k_scale_, v_scale_;
  std::vector<std::vector<float>> k_block_scales_, v_block_scales_;
  KvObserver kv_observer_;
  std::vector<MoeRoutingDecision>* routing_trace_ = nullptr;  // set_routing_trace; not owned
};

}  // namespace llm
