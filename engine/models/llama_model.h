// Llama-family decoder (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM) on the CPU:
// fp32 weights, OpenBLAS matrix products, paged KV through the selected attention backend.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "engine/models/model.h"
#include "engine/safetensors.h"

namespace llm {

struct LlamaLayerWeights {
  std::vector<float> attn_norm;  // [hidden]
  std::vector<float> wqkv;       // [q_size + 2 * kv_size, hidden] (q, k, v stacked)
  std::vector<float> bqkv;       // [q_size + 2 * kv_size] or empty
  std::vector<float> wo;         // [hidden, q_size]
  std::vector<float> bo;         // [hidden] or empty (Llama attention_bias)
  std::vector<float> mlp_norm;   // [hidden]
  std::vector<float> w_gate_up;  // [2 * intermediate, hidden] (gate, up stacked)
  std::vector<float> w_down;     // [hidden, intermediate]
  std::vector<float> b_gate_up;  // [2 * intermediate] or empty (Llama mlp_bias)
  std::vector<float> b_down;     // [hidden] or empty
};

class LlamaModel final : public Model {
 public:
  static StatusOr<std::unique_ptr<LlamaModel>> Create(const ModelConfig& config,
                                                      const WeightStore& weights,
                                                      const ModelLoadOptions& options);

  const ModelConfig& config() const override { return config_; }
  Status Forward(const ForwardBatch& batch, std::vector<float>* logits) override;
  std::string attention_backend_name() const override { return attention_->name(); }
  int num_kv_blocks() const override { return num_blocks_; }
  size_t kv_bytes_per_block() const override {
    return attention_->BlockBytes() * config_.num_layers;
  }

  // Sees every layer's new K (after RoPE, as the cache stores it) and V, [num_tokens,
  // num_kv_heads, head_dim] fp32, right before the attention backend appends them. Calibration
  // (llm-calibrate-kv) records absmax through it. Empty function: none.
  using KvObserver = std::function<void(int layer, int num_tokens, const float* k, const float* v)>;
  void set_kv_observer(KvObserver observer) { kv_observer_ = std::move(observer); }

 private:
  explicit LlamaModel(const ModelConfig& config) : config_(config) {}
  Status LoadWeights(const WeightStore& weights);
  void InitRope();
  void ApplyRope(float* x, int num_heads, int position) const;

  ModelConfig config_;
  std::vector<float> embed_;    // [vocab, hidden]
  std::vector<float> lm_head_;  // [vocab, hidden]; empty when tied to embed_
  std::vector<float> final_norm_;
  std::vector<LlamaLayerWeights> layers_;
  std::vector<float> inv_freq_;  // [head_dim / 2]

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
};

}  // namespace llm
