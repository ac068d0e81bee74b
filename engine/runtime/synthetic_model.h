// A model with no weights whose logits cost almost nothing: isolates the serving overhead
// (scheduler, batch preparation, sampling, streaming) from the model in benchmarks.
// Selected with model_dir "synthetic" or "synthetic:vocab=32000,max_len=8192,device_sampling=1".
// "step_delay_ms=N" makes every forward take at least N ms, so a test can keep a request running
// for as long as it needs without depending on how fast the machine is.
#pragma once

#include <deque>
#include <optional>

#include "engine/runtime/model.h"

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
  // With device sampling it also overlaps steps like the GPU models: Launch computes the tokens
  // at once and Collect hands them out in order; fed-back ids (-(r + 1)) read the previous
  // forward's tokens. A forward launched with deferred masks is computed when they come.
  bool supports_overlap() const override { return device_sampling_; }
  Status Launch(const ForwardBatch& batch) override;
  Status Collect(std::vector<int32_t>* tokens) override;
  Status SupplyMasks(std::vector<uint32_t> token_masks) override;
  std::string attention_backend_name() const override { return "none (synthetic)"; }
  int num_kv_blocks() const override { return num_blocks_; }
  size_t kv_bytes_per_block() const override { return 0; }

 private:
  // The one-hot-ish row's hot token: a hash of (last token, position).
  int32_t HotToken(const ForwardBatch& batch, int row) const;
  // Checks the batch's ids (fed-back ids against feed_).
  Status CheckIds(const ForwardBatch& batch) const;
  // Sleeps step_delay_ms_ (the controllable pace).
  void Pace() const;
  // Remembers the forward's tokens for the next one's fed-back ids (all rows device-sampled).
  void SetFeed(const ForwardBatch& batch, const std::vector<int32_t>& tokens);

  ModelConfig config_;
  int num_blocks_ = 0;
  bool device_sampling_ = false;
  int step_delay_ms_ = 0;
  std::vector<int32_t> feed_;                  // the last forward's tokens by logit row
  std::deque<std::vector<int32_t>> launched_;  // tokens of launched, uncollected forwards
  std::optional<ForwardBatch> deferred_;       // launched, waiting for its masks
};

}  // namespace llm
