// DeepSeek-V3's multi-token-prediction (MTP) layer as a definition on the CUDA model runner: the
// computation of cpu_deepseek_mtp.h (its oracle), vLLM's DeepSeekMultiTokenPredictorLayer:
//   e = embedding (zeroed at position 0), h = CudaStep::input_hidden (fp32, from the host)
//   x = eh_proj([enorm(e), hnorm(h)])    one bf16 GEMM over the two bf16 norm outputs side by
//                                        side, written as the fp32 residual
//   x += decoder layer N (cuda_deepseek_decoder's layer range: MLA + MoE, its own latent cache)
// The runner's final norm and LM head are shared_head.norm and shared_head.head (or the model's
// lm_head), its embedding the layer's or the model's. Every step runs eagerly (its rows read
// hidden states from the host). Built only with the CUDA backend.
#pragma once

#include <memory>

#include "engine/loader/deepseek_config.h"
#include "engine/loader/safetensors.h"
#include "engine/runtime/cuda/cuda_model_runner.h"

namespace llm {

// `weights` (null: dummy weights) decides which embedding and head the layer reads.
std::unique_ptr<CudaDecoder> NewCudaDeepseekMtp(const DeepseekConfig& config,
                                                const WeightStore* weights);

}  // namespace llm
