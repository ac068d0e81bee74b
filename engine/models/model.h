// The model-runner interface: one forward pass over a flattened batch of prefill and decode tokens.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/base/status.h"
#include "engine/model_config.h"
#include "kernels/attention_backend.h"

namespace llm {

struct ForwardBatch {
  std::vector<int32_t> token_ids;   // [num_tokens]
  std::vector<int32_t> positions;   // [num_tokens]
  AttentionBatch attn;              // block tables and slots for the same tokens
  std::vector<int32_t> logit_rows;  // rows of the batch whose logits are wanted
  // Per logit row: only its argmax is needed (greedy, no penalties, no logprobs). A model may
  // then return the argmax instead of the row's logits (see ForwardSampled).
  std::vector<uint8_t> argmax_only;
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelConfig& config() const = 0;
  // logits: [logit_rows.size(), vocab_size], resized by the call.
  virtual Status Forward(const ForwardBatch& batch, std::vector<float>* logits) = 0;
  // Forward, with the option to reduce argmax_only rows on the device: argmax[r] >= 0 gives the
  // token of logit row r, whose logits are then not filled. The default computes every row's
  // logits and leaves argmax empty.
  virtual Status ForwardSampled(const ForwardBatch& batch, std::vector<float>* logits,
                                std::vector<int32_t>* argmax) {
    argmax->clear();
    return Forward(batch, logits);
  }
  virtual std::string attention_backend_name() const = 0;
  virtual int num_kv_blocks() const = 0;
  virtual size_t kv_bytes_per_block() const = 0;  // all layers, K and V
  // Element type (and 8-bit scaling) of the KV cache, for logs and GetModelInfo.
  virtual std::string kv_cache_dtype_name() const { return "float32"; }
};

struct ModelLoadOptions {
  std::string model_dir;
  int block_size = 64;
  int num_kv_blocks = 0;  // 0: derive from kv_cache_bytes
  size_t kv_cache_bytes = 256ull << 20;
  std::string attention_backend;  // forced backend name, empty for automatic
  // KV cache element type and scales (engine/models/kv_cache_quant.h): "auto" (fp32 on CPU),
  // "int8", "fp8_e4m3" (static scales, per_head or per_channel), "fp8_e4m3_dynamic".
  std::string kv_cache_dtype = "auto";
  std::string kv_scale_granularity = "per_head";
  std::string kv_scales_file;  // llm-calibrate-kv output; empty: scales from the checkpoint
  // "cpu", "cuda", or "auto" (cuda when this build has it and a device is present).
  std::string device = "cpu";
  double gpu_memory_fraction = 0.85;  // of the memory free after weights, for the KV pool
  // Fill the config's tensors with deterministic random values on the device instead of reading
  // model.safetensors (benchmarking models too large to ship). CUDA only.
  bool dummy_weights = false;
};

// Loads config + weights and selects the attention backend (logging the selection table).
StatusOr<std::unique_ptr<Model>> LoadModel(const ModelLoadOptions& options);

}  // namespace llm
