// The layer definitions of the dense decoders (cpu_dense_decoder.h, cuda_dense_decoder.h): what one
// architecture's decoder layer is, as data. An architecture is one function in decoder_spec.cc
// that fills this from its ModelConfig; the decoder computes every architecture with the same code.
//
// One layer, with x the residual stream:
//   h = attn_in_norm(x); q, k, v = qkv(h) (+ bias); q_norm / k_norm per head (qk_norm);
//   rotary (inv_freq); attention (window_left, softmax_scale, logit_softcap, sinks);
//   a = o_proj(.) (+ bias);
//   x += attn_out_norm(a)                 (attn_out_norm empty: x += a)
//   h = ffn_in_norm(x); f = dense gated MLP or MoE block (ffn)
//   x += ffn_out_norm(f)                  (ffn_out_norm empty: x += f)
// and after the last layer logits = lm_head(norm(x)), soft-capped when final_logit_softcap > 0.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "engine/layers/cpu/cpu_mlp.h"
#include "engine/layers/cpu/cpu_moe.h"
#include "engine/loader/model_config.h"

namespace llm {

struct DecoderLayerSpec {
  // RMSNorm weight names under the layer prefix ("model.layers.N."); empty: no such norm.
  std::string attn_in_norm = "input_layernorm";
  std::string attn_out_norm;
  std::string ffn_in_norm = "post_attention_layernorm";
  std::string ffn_out_norm;

  // Attention.
  bool qkv_bias = false;
  bool o_bias = false;
  bool qk_norm = false;  // self_attn.{q_norm,k_norm}.weight [head_dim], before rotary (Qwen3)
  std::vector<float> inv_freq;  // [head_dim / 2] rotary frequencies of this layer
  int window_left = -1;         // AttentionParams::window_left
  float softmax_scale = 1.0f;
  float logit_softcap = 0.0f;  // AttentionParams::logit_softcap (Gemma)
  bool sinks = false;          // self_attn.sinks [num_q_heads]: learned sink logits (gpt-oss)

  // Feed-forward: a dense gated MLP of `intermediate`, or a routed MoE block.
  enum class Ffn { kDense, kMoe } ffn = Ffn::kDense;
  std::string mlp_prefix = "mlp.";
  MlpTensorNames mlp_names;
  int intermediate = 0;
  bool mlp_bias = false;
  CpuMlp::Gate gate;  // the activation of the dense MLP and of the experts
  MoeTensorNames moe_names;
  MoeRouting routing;
  int moe_intermediate = 0;
  int shared_intermediate = 0;  // shared experts (0: none)
};

struct DecoderSpec {
  std::vector<DecoderLayerSpec> layers;  // [num_layers]
  float rms_norm_eps = 1e-6f;
  // RMSNorm multiplies by (norm_weight_offset + w): 0 for Llama, 1 for Gemma's (1 + w).
  float norm_weight_offset = 0.0f;
  float embed_scale = 1.0f;          // multiplies the embedding rows (Gemma: sqrt(hidden))
  float final_logit_softcap = 0.0f;  // cap * tanh(logit / cap) of the LM head output; 0: none
};

// The layer definition of config.architecture; Unimplemented naming it for architectures the
// CPU decoder does not compute.
StatusOr<DecoderSpec> MakeDecoderSpec(const ModelConfig& config);

}  // namespace llm
