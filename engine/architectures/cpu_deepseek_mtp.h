// DeepSeek-V3's multi-token-prediction (MTP) layer as a definition on the CPU model runner: the
// proposer network of --speculative-method mtp (engine/speculative/mtp_proposer.h).
//
// The checkpoint stores it as model.layers.{N}.* with N = num_hidden_layers (the first of
// num_nextn_predict_layers). vLLM's DeepSeekMultiTokenPredictorLayer defines the computation: a
// row at position i reads token t_{i+1} and a hidden state h (the target's last hidden state at
// i, after the final norm, or this layer's own output at i - 1 when it chains):
//   e = enorm(embed(t_{i+1}))     (the embedding of a row at position 0 is zeroed first)
//   x = eh_proj([e, hnorm(h)])    eh_proj: [hidden, 2 * hidden], no bias; e first
//   x = decoder layer N (MLA + MoE, its own norms and latent cache) at position i
//   logits = head(shared_head.norm(x))  -> the distribution of t_{i+2}
// The runner's embedding, final norm and LM head are model.layers.N.embed_tokens (else the
// model's embed_tokens), shared_head.norm and shared_head.head (else the model's lm_head); x
// before the norm is what a chained step reads as h (ForwardBatch::hidden_before_final_norm).
#pragma once

#include <memory>

#include "engine/loader/deepseek_config.h"
#include "engine/loader/safetensors.h"
#include "engine/runtime/cpu/cpu_model_runner.h"

namespace llm {

// The model.layers.{layer}. prefix of DeepSeek's first MTP layer.
int DeepseekMtpLayer(const DeepseekConfig& config);

// The MTP layer of `config`'s checkpoint (`weights` decides which embedding and head it reads).
// Its ModelConfig is the target's with one layer.
std::unique_ptr<CpuArchitecture> NewCpuDeepseekMtp(const DeepseekConfig& config,
                                                   const WeightStore& weights);

}  // namespace llm
