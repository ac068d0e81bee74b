// Every architecture with per-head K/V attention as a definition on the CPU model runner
// (cpu_model_runner.h): fp32 weights, OpenBLAS matrix products, paged KV through the runner's
// attention backend and cache. What differs between architectures is data, their layer definition
// (decoder_spec.h): Llama, Mistral, Qwen2/3, Qwen3-MoE, Mixtral, Gemma 2/3 and gpt-oss. DeepSeek's
// latent attention is cpu_deepseek_decoder.h.
//
// A tensor-parallel rank is this definition on the plan's rank-local configuration
// (tensor_parallel_plan.h): its query and KV heads, its slice of every MLP and expert; the outputs
// of o_proj and of the feed-forward block are summed over the ranks (CpuStep::AllReduceSum)
// before the residual add and the output norms.
#pragma once

#include <memory>

#include "engine/runtime/cpu/cpu_model_runner.h"

namespace llm {

// Unimplemented naming the architecture where decoder_spec.cc has no definition of it.
StatusOr<std::unique_ptr<CpuArchitecture>> NewCpuDenseDecoder(const ModelConfig& config);

}  // namespace llm
