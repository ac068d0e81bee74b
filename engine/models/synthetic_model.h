// A model with no weights whose logits cost almost nothing: isolates the serving overhead
// (scheduler, batch preparation, sampling, streaming) from the model in benchmarks.
// Selected with model_dir "synthetic" or "synthetic:vocab=32000,max_len=8192,device_sampling=1".
#pragma once

#include "engine/models/model.h"

namespace llm {

class SyntheticModel final : public Model {
 public:
  static StatusOr<std::unique_ptr<Model>> Create(const ModelLoadOptions& options);

  const ModelConfig& config() const override { return config_; }
  // Logits: one-hot-ish row whose argmax is a hash of (last token, position), so greedy decoding
  // is deterministic and varied.
  Status Forward(const ForwardBatch& batch, std::vector<float>* logits) override;
  // With the "device_sampling=1" option the model behaves like the GPU models: device_sampled rows
  // come back as tokens (by the shared sampling definition) and only the other rows as logits,
  // so a benchmark measures the engine's per-token work without host sampling.
  Status ForwardSampled(const ForwardBatch& batch, std::vector<float>* logits,
                        std::vector<int32_t>* tokens) override;
  bool samples_on_device() const override { return device_sampling_; }
  std::string attention_backend_name() const override { return "none (synthetic)"; }
  int num_kv_blocks() const override { return num_blocks_; }
  size_t kv_bytes_per_block() const override { return 0; }

 private:
  // The one-hot-ish row's hot token: a hash of (last token, position).
  int32_t HotToken(const ForwardBatch& batch, int row) const;

  ModelConfig config_;
  int num_blocks_ = 0;
  bool device_sampling_ = false;
};

}  // namespace llm
