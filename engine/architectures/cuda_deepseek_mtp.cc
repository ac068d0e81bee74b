#include "engine/architectures/cuda_deepseek_mtp.h"

#include <string>

#include "engine/architectures/cuda_deepseek_decoder.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/ops/elementwise_ops.h"

namespace llm {
namespace {

class CudaDeepseekMtp final : public CudaDecoder {
 public:
  CudaDeepseekMtp(const DeepseekConfig& config, const WeightStore* w)
      : layer_(config.base.num_layers),
        prefix_("model.layers." + std::to_string(layer_) + "."),
        block_(NewCudaDeepseekLayers(config, layer_, 1)) {
    config_ = config.base;
    config_.num_layers = 1;
    config_.architecture_name = config.base.architecture_name + " MTP layer";
    settings_.final_norm = prefix_ + "shared_head.norm.weight";
    if (w == nullptr || w->Has(prefix_ + "shared_head.head.weight")) {
      settings_.lm_head = prefix_ + "shared_head.head.weight";
    }
    if (w != nullptr && w->Has(prefix_ + "embed_tokens.weight")) {
      settings_.embed_tokens = prefix_ + "embed_tokens.weight";
    }
  }

  const ModelConfig& config() const override { return config_; }
  CudaModelSettings settings() const override { return settings_; }
  const char* name() const override { return "deepseek-mtp"; }
  StatusOr<AttentionSpec> AttentionNeeds(const CudaLoadContext& ctx) override {
    ops_ = ctx.ops;
    return block_->AttentionNeeds(ctx);
  }
  Status UseAttention(AttentionBackends backends) override {
    return block_->UseAttention(std::move(backends));
  }
  Status Load(const CudaLoadContext& ctx) override {
    const int64_t h = config_.hidden_size;
    Bf16WeightLoader& loader = *ctx.loader;
    LLM_RETURN_IF_ERROR(loader.Load({prefix_ + "enorm.weight"}, {{h}}, 1.0f, 0.1f, &enorm_));
    LLM_RETURN_IF_ERROR(loader.Load({prefix_ + "hnorm.weight"}, {{h}}, 1.0f, 0.1f, &hnorm_));
    LLM_RETURN_IF_ERROR(
        loader.Load({prefix_ + "eh_proj.weight"}, {{h, 2 * h}}, 0.0f, 0.02f, &eh_proj_));
    return block_->Load(ctx);
  }
  AttentionBackend& attention() override { return block_->attention(); }
  std::string kv_cache_dtype_name() const override { return block_->kv_cache_dtype_name(); }
  Status BindCache(const CudaLoadContext& ctx, const std::vector<KvCacheLayer>& layers) override {
    return block_->BindCache(ctx, layers);
  }
  bool graph_safe() const override { return false; }  // its inputs come from the host
  Status Reserve(int set, int rows) override {
    LLM_RETURN_IF_ERROR(block_->Reserve(set, rows));
    const size_t T = static_cast<size_t>(rows), H = config_.hidden_size;
    Scratch& s = scratch_[set];
    LLM_RETURN_IF_ERROR(s.e.Alloc(T * H * 2));
    LLM_RETURN_IF_ERROR(s.h.Alloc(T * H * 2));
    return s.eh.Alloc(T * 2 * H * 2);
  }
  Status Plan(const ForwardBatch& batch) override { return block_->Plan(batch); }
  Status PlanGraph(const ForwardBatch& batch, GraphShape shape) override {
    return block_->PlanGraph(batch, shape);
  }
  StatusOr<CudaLayersOut> RunLayers(const CudaStep& step) override {
    if (step.input_hidden == nullptr) return InvalidArgument("the MTP layer reads hidden states");
    const int T = step.rows, H = config_.hidden_size;
    const float eps = config_.rms_norm_eps;
    cudaStream_t stream = ops_->stream;
    Scratch& s = scratch_[step.set];
    // vLLM masks the embedding of a row at position 0.
    const std::vector<int32_t>& positions = step.batch->positions;
    for (int t = 0; t < T && t < static_cast<int>(positions.size()); ++t) {
      if (positions[t] != 0) continue;
      GPU_RETURN_IF_ERROR(cudaMemsetAsync(step.residual + static_cast<size_t>(t) * H, 0,
                                          static_cast<size_t>(H) * 4, stream));
    }
    // No delta: the norms read their input and leave it as it is.
    cuda::LaunchAddRmsNorm(step.residual, nullptr, enorm_.ptr, nullptr, T, H, eps, s.e.ptr, stream);
    cuda::LaunchAddRmsNorm(const_cast<float*>(step.input_hidden), nullptr, hnorm_.ptr, nullptr, T,
                           H, eps, s.h.ptr, stream);
    // [T, 2H] = [enorm(e) | hnorm(h)] per row, then x = eh @ eh_proj^T into the residual.
    const size_t row = static_cast<size_t>(H) * 2;  // bytes of one bf16 half-row
    GPU_RETURN_IF_ERROR(cudaMemcpy2DAsync(s.eh.ptr, 2 * row, s.e.ptr, row, row, T,
                                          cudaMemcpyDeviceToDevice, stream));
    GPU_RETURN_IF_ERROR(cudaMemcpy2DAsync(static_cast<char*>(s.eh.ptr) + row, 2 * row, s.h.ptr, row,
                                          row, T, cudaMemcpyDeviceToDevice, stream));
    LLM_RETURN_IF_ERROR(
        GemmBf16(ops_->blas, s.eh.ptr, eh_proj_.ptr, T, H, 2 * H, step.residual, CUDA_R_32F));
    return block_->RunLayers(step);
  }
  std::string Summary() const override { return "MTP layer " + std::to_string(layer_); }
  bool keeps_checkpoint_fp8() const override { return block_->keeps_checkpoint_fp8(); }
  bool reads_input_hidden() const override { return true; }
  bool set_routing_trace(std::vector<MoeRoutingDecision>* trace) override {
    return block_->set_routing_trace(trace);
  }

 private:
  struct Scratch {
    DeviceBuffer e, h;  // bf16 [rows, hidden]: enorm(embedding), hnorm(hidden)
    DeviceBuffer eh;    // bf16 [rows, 2 * hidden]: both, side by side
  };
  int layer_;
  std::string prefix_;
  std::unique_ptr<CudaDecoder> block_;  // decoder layer `layer_`
  ModelConfig config_;
  CudaModelSettings settings_;
  const CudaLinearOps* ops_ = nullptr;
  DeviceBuffer enorm_, hnorm_;  // bf16 [hidden]
  DeviceBuffer eh_proj_;        // bf16 [hidden, 2 * hidden]
  Scratch scratch_[2];          // eager, graph (unused: no graphs)
};

}  // namespace

std::unique_ptr<CudaDecoder> NewCudaDeepseekMtp(const DeepseekConfig& config,
                                                const WeightStore* weights) {
  return std::make_unique<CudaDeepseekMtp>(config, weights);
}

}  // namespace llm
