#include "engine/architectures/cpu_deepseek_mtp.h"

#include <algorithm>
#include <string>
#include <vector>

#include "engine/architectures/cpu_deepseek_decoder.h"
#include "engine/layers/cpu/cpu_ops.h"

namespace llm {
namespace {

class CpuDeepseekMtp final : public CpuArchitecture {
 public:
  CpuDeepseekMtp(const DeepseekConfig& config, const WeightStore& w)
      : layer_(DeepseekMtpLayer(config)),
        prefix_("model.layers." + std::to_string(layer_) + "."),
        block_(NewCpuDeepseekLayers(config, layer_, 1)) {
    config_ = config.base;
    config_.num_layers = 1;
    config_.architecture_name = config.base.architecture_name + " MTP layer";
    settings_.norm_eps = config.base.rms_norm_eps;
    settings_.final_norm = prefix_ + "shared_head.norm.weight";
    if (w.Has(prefix_ + "embed_tokens.weight"))
      settings_.embed_tokens = prefix_ + "embed_tokens.weight";
    if (w.Has(prefix_ + "shared_head.head.weight"))
      settings_.lm_head = prefix_ + "shared_head.head.weight";
  }

  const ModelConfig& config() const override { return config_; }
  CpuModelSettings settings() const override { return settings_; }
  StatusOr<AttentionSpec> MakeAttentionSpec(const ModelLoadOptions& options) const override {
    return block_->MakeAttentionSpec(options);
  }
  Status LoadLayers(const WeightStore& w) override {
    const int64_t h = config_.hidden_size;
    LLM_RETURN_IF_ERROR(w.ReadF32(prefix_ + "enorm.weight", {h}, &enorm_));
    LLM_RETURN_IF_ERROR(w.ReadF32(prefix_ + "hnorm.weight", {h}, &hnorm_));
    LLM_RETURN_IF_ERROR(w.ReadF32(prefix_ + "eh_proj.weight", {h, 2 * h}, &eh_proj_));
    return block_->LoadLayers(w);
  }
  Status RunLayers(const CpuStep& step) const override {
    const int T = step.num_tokens, H = config_.hidden_size;
    const ForwardBatch& batch = *step.batch;
    // [T, 2H]: enorm(embedding) then hnorm(hidden) per row.
    std::vector<float> eh(static_cast<size_t>(T) * 2 * H);
    for (int t = 0; t < T; ++t) {
      float* e = step.residual + static_cast<size_t>(t) * H;
      if (batch.positions[t] == 0) std::fill_n(e, H, 0.0f);  // vLLM masks position 0's input
      float* row = eh.data() + static_cast<size_t>(t) * 2 * H;
      cpu::RmsNorm(e, enorm_.data(), 1, H, settings_.norm_eps, row);
      cpu::RmsNorm(batch.input_hidden.data() + static_cast<size_t>(t) * H, hnorm_.data(), 1, H,
                   settings_.norm_eps, row + H);
    }
    cpu::Linear(eh.data(), eh_proj_.data(), nullptr, T, H, 2 * H, step.residual);
    return block_->RunLayers(step);  // the residual stream: x + attention + MoE
  }
  bool routes_experts() const override { return block_->routes_experts(); }
  bool reads_input_hidden() const override { return true; }
  std::string CacheSummary(const AttentionSpec& spec) const override {
    return "MTP layer " + std::to_string(layer_) + ": " + block_->CacheSummary(spec);
  }

 private:
  int layer_;
  std::string prefix_;
  std::unique_ptr<CpuArchitecture> block_;  // decoder layer `layer_`
  ModelConfig config_;
  CpuModelSettings settings_;
  std::vector<float> enorm_, hnorm_;  // [hidden]
  std::vector<float> eh_proj_;        // [hidden, 2 * hidden]
};

}  // namespace

int DeepseekMtpLayer(const DeepseekConfig& config) {
  return config.base.num_layers;
}

std::unique_ptr<CpuArchitecture> NewCpuDeepseekMtp(const DeepseekConfig& config,
                                                   const WeightStore& weights) {
  return std::make_unique<CpuDeepseekMtp>(config, weights);
}

}  // namespace llm
