// The one CPU model runner (the numerical oracle): every architecture's forward on the CPU goes
// through it. It owns the token embedding (times the architecture's embed scale), the final norm,
// the LM head (tied or not) and the final logit soft-cap, the attention backend (created once from
// the architecture's AttentionSpec through the registry, its selection table logged, failing
// before any weight is read), the KV cache storage (sized from the backend's BlockBytes() and
// ModelLoadOptions::num_kv_blocks / kv_cache_bytes, with the 8-bit scale arrays the spec needs),
// the routing trace and the KV observer of calibration. An architecture is a CpuArchitecture: its
// AttentionSpec, its layer weights and the computation of its layers over the residual stream,
// written against the runner's KV cache views and backend and the fp32 layers in
// engine/layers/cpu.
//
// Sampling is not here: the CPU runner returns logits (samples_on_device() is false) and the
// engine samples them on the host (engine/sampling/sampler.h), by the same definition as the CUDA
// runner's device sampling.
//
// Definitions: cpu_dense_decoder.h (every per-head K/V architecture: Llama, Mistral, Qwen2/3,
// Qwen3-MoE, Mixtral, Gemma 2/3, gpt-oss), cpu_deepseek_decoder.h (DeepSeek V2 / V3: MLA + MoE).
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/loader/safetensors.h"
#include "engine/loader/tensor_parallel_plan.h"
#include "engine/runtime/communicator.h"
#include "engine/runtime/model.h"
#include "kernels/attention_backend.h"

namespace llm {

// What an architecture changes around its layers, in the runner's embedding, final norm and LM
// head (DecoderSpec's model-level fields; Gemma's values in the comments).
struct CpuModelSettings {
  float embed_scale = 1.0f;                      // the embedding rows times this (sqrt(hidden))
  std::string final_norm = "model.norm.weight";  // the final RMSNorm's weight [hidden]
  float norm_weight_offset = 0.0f;               // the final norm scales by (offset + w) (1)
  float norm_eps = 1e-6f;                        // the final norm's epsilon
  float final_logit_softcap = 0.0f;  // logits -> cap * tanh(logits / cap); 0: none (Gemma 2)
  // The embedding and LM head tensors (an MTP layer may have its own, or share the model's).
  std::string embed_tokens = "model.embed_tokens.weight";
  std::string lm_head = "lm_head.weight";
};

// Sees every layer's new K (after RoPE, as the cache stores it) and V, [num_tokens, num_kv_heads,
// head_dim] fp32, right before the attention backend appends them. Calibration (llm-calibrate-kv)
// records absmax through it.
using KvObserver = std::function<void(int layer, int num_tokens, const float* k, const float* v)>;

// One step as the runner lends it to the layers.
struct CpuStep {
  const ForwardBatch* batch = nullptr;
  int num_tokens = 0;
  float* residual = nullptr;  // [num_tokens, hidden]: the embedding; the layers add into it
  // The runner's cache, one view per layer (AttentionBackend's KvCacheLayer). Per-head K/V: k and
  // v [num_blocks, num_kv_heads, block_size, head_dim] with the scale arrays of the spec's
  // kv_quant. MLA: k alone holds the latent rows [num_blocks, block_size, L] (one KV "head").
  std::span<const KvCacheLayer> kv;
  // The backend, planned for this step, and the spec it was created from (kv dtype, block size).
  // For AttentionKind::kMla, `mla` is the same backend typed.
  const AttentionSpec* spec = nullptr;
  AttentionBackend* attention = nullptr;
  MlaAttentionBackend* mla = nullptr;
  std::vector<MoeRoutingDecision>* routing_trace = nullptr;  // null: record nothing
  const KvObserver* kv_observer = nullptr;                   // null: none (per-head K/V only)
  // A tensor-parallel rank's group (tensor_parallel_plan.h); null for the whole model.
  Communicator* comm = nullptr;

  // x[n] summed over the ranks in place (the output of a row-split projection, before the
  // residual add); nothing without a group.
  Status AllReduceSum(float* x, size_t n) const {
    return comm == nullptr ? Status::Ok() : comm->AllReduceSum(x, n, DType::kF32, nullptr);
  }
};

// One rank of a tensor-parallel model: the plan its architecture and weights were cut by (the
// runner takes the model's configuration and its vocabulary slice from it) and its group. Both
// null: the whole model.
struct CpuTensorParallelRank {
  const TensorParallelPlan* plan = nullptr;
  Communicator* comm = nullptr;
};

// An architecture on the runner.
class CpuArchitecture {
 public:
  virtual ~CpuArchitecture() = default;
  virtual const ModelConfig& config() const = 0;
  virtual CpuModelSettings settings() const = 0;
  // The attention the layers need under `options` (its kind, cache dtype and scaling, features),
  // asked of the registry before any weight is read: an option the architecture cannot honour
  // fails here.
  virtual StatusOr<AttentionSpec> MakeAttentionSpec(const ModelLoadOptions& options) const = 0;
  // Loads every layer's weights (after the runner's embedding, final norm and LM head).
  virtual Status LoadLayers(const WeightStore& weights) = 0;
  // Every layer over step.num_tokens rows; the residual holds the embedding on entry and the
  // last layer's output (before the final norm) on return.
  virtual Status RunLayers(const CpuStep& step) const = 0;
  // Whether the layers route tokens to experts (what set_routing_trace answers).
  virtual bool routes_experts() const = 0;
  // Whether the layers read ForwardBatch::input_hidden beside the tokens (an MTP layer): the
  // runner then requires one hidden row per token, and refuses one otherwise.
  virtual bool reads_input_hidden() const { return false; }
  // A line describing the KV cache of `spec` for the load log, or empty.
  virtual std::string CacheSummary(const AttentionSpec& spec) const {
    (void)spec;
    return "";
  }
};

class CpuModelRunner final : public Model {
 public:
  // Selects the attention backend, loads the embedding, final norm, LM head and the layers, and
  // allocates the KV cache. A tensor-parallel rank: `arch` is built on tp.plan->local and
  // `weights` are the rank's (sharded_weights.h).
  static StatusOr<std::unique_ptr<CpuModelRunner>> Create(std::unique_ptr<CpuArchitecture> arch,
                                                          const WeightStore& weights,
                                                          const ModelLoadOptions& options,
                                                          CpuTensorParallelRank tp = {});

  // The model's configuration (a tensor-parallel rank's architecture has the rank-local one).
  const ModelConfig& config() const override { return config_; }
  Status Forward(const ForwardBatch& batch, std::vector<float>* logits) override;
  std::string attention_backend_name() const override { return attention_->name(); }
  int num_kv_blocks() const override { return num_blocks_; }
  Status AllocateKvCache(int num_blocks) override;
  size_t kv_bytes_per_block() const override {
    return attention_->BlockBytes() * config().num_layers;
  }
  bool returns_hidden_states() const override { return true; }
  std::span<const float> hidden_states() const override { return hidden_; }
  // Records every MoE routing decision with its margin (moe_router.h); false without MoE layers.
  bool set_routing_trace(std::vector<MoeRoutingDecision>* trace) override;
  // Calibration's view of every layer's new K and V (KvObserver); an empty function removes it.
  // False (and nothing set) for an architecture without per-head K/V (MLA).
  bool set_kv_observer(KvObserver observer);

 private:
  explicit CpuModelRunner(std::unique_ptr<CpuArchitecture> arch) : arch_(std::move(arch)) {}
  Status Init(const WeightStore& weights, const ModelLoadOptions& options,
              const CpuTensorParallelRank& tp);
  // The LM head of the rows in logit_rows of x (after the final norm) into *logits
  // [rows, vocab]: the rank's slice gathered from every rank, padding dropped, with a group.
  Status Logits(const float* x, const std::vector<int32_t>& logit_rows, std::vector<float>* logits);
  // The KV cache of every layer for num_blocks_ blocks in the layout of spec_ and its views.
  Status AllocateCache();

  std::unique_ptr<CpuArchitecture> arch_;
  ModelConfig config_;  // the model's
  CpuModelSettings settings_;
  // The vocabulary rows [vocab_begin_, vocab_begin_ + vocab_rows_) that embed_ and lm_head_ hold
  // (all of it but on a tensor-parallel rank, whose tables have head_rows_ rows, zero padded).
  int64_t vocab_begin_ = 0, vocab_rows_ = 0, head_rows_ = 0;
  Communicator* comm_ = nullptr;  // a tensor-parallel rank's group, or null
  AttentionSpec spec_;
  std::unique_ptr<AttentionBackend> attention_;
  MlaAttentionBackend* mla_ = nullptr;  // attention_, typed, for AttentionKind::kMla
  std::vector<float> embed_;            // [head_rows_, hidden]
  std::vector<float> lm_head_;          // [head_rows_, hidden]; empty when tied to embed_
  std::vector<float> final_norm_;       // [hidden], offset added
  std::vector<float> hidden_;           // [hidden_rows, hidden] of the last forward

  int block_size_ = 0;
  int num_blocks_ = 0;
  // Per layer [blocks, kv_heads, bs, d] of the spec's kv dtype (8-bit caches use the bytes); MLA:
  // k_cache_ alone, [blocks, bs, L].
  std::vector<std::vector<float>> k_cache_, v_cache_;
  // 8-bit caches: static dequant scales per layer ([kv_heads] or [kv_heads * d]), or dynamic
  // per-token scales per layer ([blocks, kv_heads, bs]); empty otherwise.
  std::vector<std::vector<float>> k_scale_, v_scale_;
  std::vector<std::vector<float>> k_block_scales_, v_block_scales_;
  std::vector<KvCacheLayer> kv_;  // per layer, views of the arrays above

  KvObserver kv_observer_;
  std::vector<MoeRoutingDecision>* routing_trace_ = nullptr;  // set_routing_trace; not owned
};

}  // namespace llm
