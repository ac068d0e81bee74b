// Model factory: picks the implementation for a model directory.
#include "engine/models/deepseek_model.h"
#include "engine/models/llama_model.h"
#include "engine/models/model.h"
#include "engine/models/synthetic_model.h"

namespace llm {

StatusOr<std::unique_ptr<Model>> LoadModel(const ModelLoadOptions& options) {
  if (options.model_dir.rfind("synthetic", 0) == 0) return SyntheticModel::Create(options);
  if (IsDeepseekModelDir(options.model_dir)) {  // MLA + MoE: its own config and model
    LLM_ASSIGN_OR_RETURN(DeepseekConfig config, LoadDeepseekConfig(options.model_dir));
    if (options.block_size <= 0 || options.block_size > 1024) {
      return InvalidArgument("block_size must be in [1, 1024]");
    }
    LLM_ASSIGN_OR_RETURN(auto weights, WeightStore::Open(options.model_dir));
    LLM_ASSIGN_OR_RETURN(auto model, DeepseekModel::Create(config, *weights, options));
    return std::unique_ptr<Model>(std::move(model));
  }
  LLM_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(options.model_dir));
  if (options.block_size <= 0 || options.block_size > 1024) {
    return InvalidArgument("block_size must be in [1, 1024]");
  }
  LLM_ASSIGN_OR_RETURN(auto weights, WeightStore::Open(options.model_dir));
  LLM_ASSIGN_OR_RETURN(auto model, LlamaModel::Create(config, *weights, options));
  return std::unique_ptr<Model>(std::move(model));
}

}  // namespace llm
