// Model factory: picks the implementation for a model directory.
#include "engine/models/model.h"
#include "engine/models/deepseek_model.h"
#include "engine/models/llama_model.h"
#include "engine/models/synthetic_model.h"
#ifdef LLM_HAVE_CUDA
#include "engine/models/cuda_deepseek_model.h"
#include "engine/models/cuda_llama_model.h"
#endif

namespace llm {
namespace {

// DeepSeek-V3's multi-token-prediction layers (num_nextn_predict_layers of them, numbered from
// num_hidden_layers): a speculative-decoding head that HF does not load either.
bool IsMtpLayerTensor(const std::string& name, const void* ctx) {
  const auto& d = *static_cast<const DeepseekConfig*>(ctx);
  for (int l = d.base.num_layers; l < d.base.num_layers + d.num_nextn_predict_layers; ++l) {
    if (name.rfind("model.layers." + std::to_string(l) + ".", 0) == 0) return true;
  }
  return false;
}

StatusOr<std::unique_ptr<WeightStore>> OpenWeights(const std::string& model_dir,
                                                   const ModelConfig& config) {
  LLM_ASSIGN_OR_RETURN(auto weights, WeightStore::Open(model_dir));
  weights->set_quantization(config.quantization);
  return weights;
}

}  // namespace

Status CheckMlaKernelOption(const std::string& value) {
  if (value == "auto" || value == "wgmma" || value == "portable") return Status::Ok();
  return InvalidArgument("mla_kernel must be auto, wgmma or portable, got '" + value + "'");
}

Status CheckC8PrefillOption(const std::string& value) {
  if (value == "auto" || value == "tiles" || value == "fmha") return Status::Ok();
  return InvalidArgument("c8_prefill must be auto, tiles or fmha, got '" + value + "'");
}

StatusOr<std::unique_ptr<Model>> LoadModel(const ModelLoadOptions& options) {
  LLM_RETURN_IF_ERROR(CheckMlaKernelOption(options.mla_kernel));
  LLM_RETURN_IF_ERROR(CheckC8PrefillOption(options.c8_prefill));
  if (options.model_dir.rfind("synthetic", 0) == 0) return SyntheticModel::Create(options);
  if (options.weight_dtype != "auto" && options.weight_dtype != "bf16" &&
      options.weight_dtype != "fp8") {
    return InvalidArgument("weight_dtype must be auto, bf16 or fp8, got '" + options.weight_dtype +
                           "'");
  }
  const bool fp8_weights = options.weight_dtype == "fp8";
  if (IsDeepseekModelDir(options.model_dir)) {  // MLA + MoE: its own config and model
    if (fp8_weights) return Unimplemented("fp8 weights are implemented for Llama-family models");
    LLM_ASSIGN_OR_RETURN(DeepseekConfig config, LoadDeepseekConfig(options.model_dir));
    if (options.block_size <= 0 || options.block_size > 1024) {
      return InvalidArgument("block_size must be in [1, 1024]");
    }
#ifdef LLM_HAVE_CUDA
    if (options.device == "cuda" || (options.device == "auto" && CudaAvailable())) {
      if (options.dummy_weights) return CreateCudaDeepseekModel(config, nullptr, options);
      LLM_ASSIGN_OR_RETURN(auto weights, OpenWeights(options.model_dir, config.base));
      LLM_ASSIGN_OR_RETURN(auto model, CreateCudaDeepseekModel(config, weights.get(), options));
      LLM_RETURN_IF_ERROR(
          weights->CheckAllConsumed(config.base.architecture_name, IsMtpLayerTensor, &config));
      return model;
    }
#endif
    if (options.device == "cuda") return Unavailable("this build has no CUDA backend");
    if (options.dummy_weights) return InvalidArgument("dummy weights need the cuda device");
    LLM_ASSIGN_OR_RETURN(auto weights, OpenWeights(options.model_dir, config.base));
    LLM_ASSIGN_OR_RETURN(auto model, DeepseekModel::Create(config, *weights, options));
    LLM_RETURN_IF_ERROR(
        weights->CheckAllConsumed(config.base.architecture_name, IsMtpLayerTensor, &config));
    return std::unique_ptr<Model>(std::move(model));
  }
  LLM_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(options.model_dir));
  if (options.block_size <= 0 || options.block_size > 1024) {
    return InvalidArgument("block_size must be in [1, 1024]");
  }
  if (options.device != "cpu" && options.device != "cuda" && options.device != "auto") {
    return InvalidArgument("device must be cpu, cuda or auto, got '" + options.device + "'");
  }
#ifdef LLM_HAVE_CUDA
  if (options.device == "cuda" || (options.device == "auto" && CudaAvailable())) {
    if (options.dummy_weights) return CreateCudaLlamaModel(config, nullptr, options);
    LLM_ASSIGN_OR_RETURN(auto weights, OpenWeights(options.model_dir, config));
    LLM_ASSIGN_OR_RETURN(auto model, CreateCudaLlamaModel(config, weights.get(), options));
    LLM_RETURN_IF_ERROR(weights->CheckAllConsumed(config.architecture_name));
    return model;
  }
#else
  if (options.device == "cuda") {
    return Unavailable(
        "device 'cuda' requested but this build has no CUDA backend "
        "(configure with the cuda preset)");
  }
#endif
  if (options.dummy_weights) return InvalidArgument("dummy weights need the cuda device");
  if (fp8_weights) return InvalidArgument("fp8 weights need the cuda device");
  LLM_ASSIGN_OR_RETURN(auto weights, OpenWeights(options.model_dir, config));
  LLM_ASSIGN_OR_RETURN(auto model, LlamaModel::Create(config, *weights, options));
  LLM_RETURN_IF_ERROR(weights->CheckAllConsumed(config.architecture_name));
  return std::unique_ptr<Model>(std::move(model));
}

}  // namespace llm
