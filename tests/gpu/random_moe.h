// Small random bf16 MoE checkpoints (Mixtral, Qwen3-MoE, gpt-oss) for the whole-model GPU tests,
// in the HF layout.
#pragma once

#include <catch2/catch.hpp>

#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/gpu/random_llama.h"

namespace llm::gpu_test {

enum class RandomMoeArch { kMixtral, kQwen3Moe, kGptOss };

// The knobs of the random gpt-oss model (WriteRandomMoe with kGptOss); the defaults are the
// whole-model test's model (test_cuda_moe_archs.cc). Layers alternate sliding / full from layer 0
// (GptOssConfig's rule for an absent layer_types); lm_head_std sets the logits' scale (std about
// lm_head_std * sqrt(hidden)).
struct GptOssShape {
  int hidden = 256, layers = 3, head_dim = 64, window = 32, experts = 8, top_k = 4;
  int expert_inter = 256;
  float lm_head_std = 1.0f;
  uint32_t seed = 22;
  int vocab = 600, max_position_embeddings = 2048;
  // The experts as gpt-oss checkpoints store them: MXFP4 _blocks / _scales (random e2m1 codes,
  // scales 2^-4 for gate_up and 2^-8 for down: about the bf16 experts' magnitudes) and
  // quantization_config mxfp4; the biases stay bf16.
  bool mxfp4 = false;
  // Scales of the attention block's output (o_proj weight and bias) and of the experts' output
  // (down_proj weight and bias; bf16 experts only): 0 removes that block from the residual stream
  // with every other weight unchanged (the same random draws), to tell which block brings an error.
  float attn_out_scale = 1.0f, moe_out_scale = 1.0f;
};

// Random MXFP4 blocks [E, rows, k / 32, 16] and scales [E, rows, k / 32] (scale byte `scale`).
inline void AddRandomMxfp4(RandomCheckpoint& ck, const std::string& name, int64_t E, int64_t rows,
                           int64_t k, uint8_t scale) {
  const int64_t groups = k / 32;
  TensorToWrite b{name + "_blocks", DType::kU8, {E, rows, groups, 16}, {}};
  b.data.resize(static_cast<size_t>(E * rows * groups * 16));
  for (auto& x : b.data) x = static_cast<std::byte>(ck.rng()() & 0xFF);
  TensorToWrite s{name + "_scales", DType::kU8, {E, rows, groups}, {}};
  s.data.assign(static_cast<size_t>(E * rows * groups), static_cast<std::byte>(scale));
  ck.tensors().push_back(std::move(b));
  ck.tensors().push_back(std::move(s));
}

// Mixtral: 8 experts top-2 (renormalized) under block_sparse_moe.{gate, experts.N.{w1,w3,w2}} on
// every layer. Qwen3-MoE: 16 experts top-4 under mlp.{gate, experts.N.{gate,up,down}_proj},
// norm_topk_prob false (the weights stay the full softmax's), q/k norms, layer 1 a dense MLP
// (mlp_only_layers). The router is peaky (std 1 over hidden 256: logits of std ~16), so the
// expert at the top-k boundary carries a small weight and a bf16 flip there moves little.
// Both head_dim 128. gpt-oss (GptOssShape, by default): head_dim 64, q/k/v/o biases, learned sink
// logits, layers 0 and 2 sliding over 32 keys, YaRN rope (its real scaling), 8 stacked experts
// top-4 with biases (gate_up interleaved, input dimension first), a router bias, the clamped
// SwiGLU.
// `oss` shapes the gpt-oss model only.
inline std::string WriteRandomMoe(const std::string& name, RandomMoeArch arch,
                                  const GptOssShape& oss_shape = {}) {
  const bool qwen3 = arch == RandomMoeArch::kQwen3Moe, oss = arch == RandomMoeArch::kGptOss;
  const GptOssShape& o = oss_shape;
  const int inter = oss ? o.expert_inter : 512;
  const int experts = qwen3 ? 16 : oss ? o.experts : 8, top_k = qwen3 ? 4 : oss ? o.top_k : 2;
  const int moe_inter = qwen3 ? 128 : inter;
  const RandomShape shape = oss ? RandomShape{.hidden = o.hidden,
                                              .head_dim = o.head_dim,
                                              .inter = inter,
                                              .layers = o.layers,
                                              .vocab = o.vocab}
                                : RandomShape{.head_dim = 128, .inter = inter};
  RandomCheckpoint ck(name, qwen3 ? "Qwen3MoeForCausalLM" : "MixtralForCausalLM", shape,
                      qwen3 ? 21
                      : oss ? o.seed
                            : 22);
  nlohmann::json& cfg = ck.config();
  cfg["model_type"] = qwen3 ? "qwen3_moe" : "mixtral";
  cfg["rope_theta"] = 1000000.0;
  cfg["sliding_window"] = nullptr;
  cfg["num_experts_per_tok"] = top_k;
  if (oss) {
    cfg["architectures"] = {"GptOssForCausalLM"};
    cfg["model_type"] = "gpt_oss";
    cfg["num_local_experts"] = experts;
    cfg["attention_bias"] = true;
    cfg["sliding_window"] = o.window;
    cfg["max_position_embeddings"] = o.max_position_embeddings;
    nlohmann::json types = nlohmann::json::array();
    for (int l = 0; l < o.layers; ++l) {
      types.push_back(l % 2 == 0 ? "sliding_attention" : "full_attention");
    }
    cfg["layer_types"] = types;
    cfg["swiglu_limit"] = 7.0;
    cfg["rope_theta"] = 150000.0;
    cfg["rope_scaling"] = {{"rope_type", "yarn"},
                           {"factor", 32.0},
                           {"beta_fast", 32.0},
                           {"beta_slow", 1.0},
                           {"original_max_position_embeddings", 4096},
                           {"truncate", false}};
    if (o.mxfp4) cfg["quantization_config"] = {{"quant_method", "mxfp4"}};
  } else if (qwen3) {
    cfg["num_experts"] = experts;
    cfg["moe_intermediate_size"] = moe_inter;
    cfg["norm_topk_prob"] = false;
    cfg["decoder_sparse_step"] = 1;
    cfg["mlp_only_layers"] = {1};
    cfg["use_sliding_window"] = false;
  } else {
    cfg["num_local_experts"] = experts;
  }
  const RandomShape& s = ck.shape();
  const int hidden = s.hidden, head_dim = s.head_dim;
  const int64_t q = ck.q_width(), kv = ck.kv_width();
  ck.Add("model.embed_tokens.weight", {s.vocab, hidden}, 0, 1.0f);
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    ck.Add(p + "input_layernorm.weight", {hidden}, 1.0f, 0.1f);
    ck.Add(p + "post_attention_layernorm.weight", {hidden}, 1.0f, 0.1f);
    ck.Add(p + "self_attn.q_proj.weight", {q, hidden}, 0, 0.08f);
    ck.Add(p + "self_attn.k_proj.weight", {kv, hidden}, 0, 0.08f);
    ck.Add(p + "self_attn.v_proj.weight", {kv, hidden}, 0, 0.08f);
    if (qwen3) {
      ck.Add(p + "self_attn.q_norm.weight", {head_dim}, 1.0f, 0.1f);
      ck.Add(p + "self_attn.k_norm.weight", {head_dim}, 1.0f, 0.1f);
    }
    ck.Add(p + "self_attn.o_proj.weight", {hidden, q}, 0, 0.05f * (oss ? o.attn_out_scale : 1.0f));
    if (oss) {
      ck.Add(p + "self_attn.q_proj.bias", {q}, 0, 0.1f);
      ck.Add(p + "self_attn.k_proj.bias", {kv}, 0, 0.1f);
      ck.Add(p + "self_attn.v_proj.bias", {kv}, 0, 0.1f);
      ck.Add(p + "self_attn.o_proj.bias", {hidden}, 0, 0.1f * o.attn_out_scale);
      ck.Add(p + "self_attn.sinks", {s.heads}, 0, 1.0f);
      ck.Add(p + "mlp.router.weight", {experts, hidden}, 0, 1.0f);
      ck.Add(p + "mlp.router.bias", {experts}, 0, 1.0f);
      // Wide enough that the clamp at 7 bites sometimes.
      if (o.mxfp4) {
        AddRandomMxfp4(ck, p + "mlp.experts.gate_up_proj", experts, 2 * inter, hidden, 123);
      } else {
        ck.Add(p + "mlp.experts.gate_up_proj", {experts, hidden, 2 * inter}, 0, 0.3f);
      }
      ck.Add(p + "mlp.experts.gate_up_proj_bias", {experts, 2 * inter}, 0, 0.5f);
      if (o.mxfp4) {
        AddRandomMxfp4(ck, p + "mlp.experts.down_proj", experts, hidden, inter, 119);
      } else {
        ck.Add(p + "mlp.experts.down_proj", {experts, inter, hidden}, 0, 0.02f * o.moe_out_scale);
      }
      ck.Add(p + "mlp.experts.down_proj_bias", {experts, hidden}, 0, 0.1f * o.moe_out_scale);
      continue;
    }
    if (qwen3 && l == 1) {  // mlp_only_layers
      ck.Add(p + "mlp.gate_proj.weight", {inter, hidden}, 0, 0.06f);
      ck.Add(p + "mlp.up_proj.weight", {inter, hidden}, 0, 0.06f);
      ck.Add(p + "mlp.down_proj.weight", {hidden, inter}, 0, 0.04f);
      continue;
    }
    const std::string b = p + (qwen3 ? "mlp." : "block_sparse_moe.");
    ck.Add(b + "gate.weight", {experts, hidden}, 0, 1.0f);
    for (int e = 0; e < experts; ++e) {
      const std::string ep = b + "experts." + std::to_string(e) + ".";
      ck.Add(ep + (qwen3 ? "gate_proj" : "w1") + ".weight", {moe_inter, hidden}, 0, 0.06f);
      ck.Add(ep + (qwen3 ? "up_proj" : "w3") + ".weight", {moe_inter, hidden}, 0, 0.06f);
      ck.Add(ep + (qwen3 ? "down_proj" : "w2") + ".weight", {hidden, moe_inter}, 0,
             qwen3 ? 0.08f : 0.04f);
    }
  }
  ck.Add("model.norm.weight", {hidden}, 1.0f, 0.1f);
  // Wide by default: top-2 gaps well above bf16 rounding.
  ck.Add("lm_head.weight", {s.vocab, hidden}, 0, oss ? o.lm_head_std : 1.0f);
  return ck.Write();
}

}  // namespace llm::gpu_test
