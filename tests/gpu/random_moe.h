// Small random bf16 MoE checkpoints (Mixtral, Qwen3-MoE, gpt-oss) for the whole-model GPU tests,
// in the HF layout.
#pragma once

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/loader/safetensors.h"
#include "tests/gpu/random_llama.h"

namespace llm::gpu_test {

enum class RandomMoeArch { kMixtral, kQwen3Moe, kGptOss };

// Mixtral: 8 experts top-2 (renormalized) under block_sparse_moe.{gate, experts.N.{w1,w3,w2}} on
// every layer. Qwen3-MoE: 16 experts top-4 under mlp.{gate, experts.N.{gate,up,down}_proj},
// norm_topk_prob false (the weights stay the full softmax's), q/k norms, layer 1 a dense MLP
// (mlp_only_layers). The router is peaky (std 1 over hidden 256: logits of std ~16), so the
// expert at the top-k boundary carries a small weight and a bf16 flip there moves little.
// Both head_dim 128. gpt-oss: head_dim 64, q/k/v/o biases, learned sink logits, layers 0 and 2
// sliding over 32 keys, YaRN rope (its real scaling), 8 stacked experts top-4 with biases
// (gate_up interleaved, input dimension first), a router bias, the clamped SwiGLU.
inline std::string WriteRandomMoe(const std::string& name, RandomMoeArch arch) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("llm_gpu_model_" + name);
  fs::create_directories(dir);
  const bool qwen3 = arch == RandomMoeArch::kQwen3Moe, oss = arch == RandomMoeArch::kGptOss;
  const int hidden = 256, heads = 4, kv_heads = 2, head_dim = oss ? 64 : 128, layers = 3;
  const int vocab = 600;
  const int inter = oss ? 256 : 512, experts = qwen3 ? 16 : 8, top_k = qwen3 || oss ? 4 : 2;
  const int moe_inter = qwen3 ? 128 : inter;
  nlohmann::json cfg = {{"architectures", {qwen3 ? "Qwen3MoeForCausalLM" : "MixtralForCausalLM"}},
                        {"model_type", qwen3 ? "qwen3_moe" : "mixtral"},
                        {"hidden_size", hidden},
                        {"intermediate_size", inter},
                        {"num_hidden_layers", layers},
                        {"num_attention_heads", heads},
                        {"num_key_value_heads", kv_heads},
                        {"head_dim", head_dim},
                        {"vocab_size", vocab},
                        {"max_position_embeddings", 2048},
                        {"rms_norm_eps", 1e-5},
                        {"rope_theta", 1000000.0},
                        {"tie_word_embeddings", false},
                        {"sliding_window", nullptr},
                        {"num_experts_per_tok", top_k},
                        {"torch_dtype", "bfloat16"}};
  if (oss) {
    cfg["architectures"] = {"GptOssForCausalLM"};
    cfg["model_type"] = "gpt_oss";
    cfg["num_local_experts"] = experts;
    cfg["attention_bias"] = true;
    cfg["sliding_window"] = 32;
    cfg["layer_types"] = {"sliding_attention", "full_attention", "sliding_attention"};
    cfg["swiglu_limit"] = 7.0;
    cfg["rope_theta"] = 150000.0;
    cfg["rope_scaling"] = {{"rope_type", "yarn"},
                           {"factor", 32.0},
                           {"beta_fast", 32.0},
                           {"beta_slow", 1.0},
                           {"original_max_position_embeddings", 4096},
                           {"truncate", false}};
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
  std::ofstream(dir / "config.json") << cfg.dump();
  std::mt19937 rng(qwen3 ? 21 : 22);
  std::vector<TensorToWrite> ts;
  auto add = [&](const std::string& n, std::vector<int64_t> shape, float mean, float std) {
    ts.push_back(RandomBf16Tensor(n, std::move(shape), mean, std, rng));
  };
  const int64_t q = heads * head_dim, kv = kv_heads * head_dim;
  add("model.embed_tokens.weight", {vocab, hidden}, 0, 1.0f);
  for (int l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {hidden}, 1.0f, 0.1f);
    add(p + "post_attention_layernorm.weight", {hidden}, 1.0f, 0.1f);
    add(p + "self_attn.q_proj.weight", {q, hidden}, 0, 0.08f);
    add(p + "self_attn.k_proj.weight", {kv, hidden}, 0, 0.08f);
    add(p + "self_attn.v_proj.weight", {kv, hidden}, 0, 0.08f);
    if (qwen3) {
      add(p + "self_attn.q_norm.weight", {head_dim}, 1.0f, 0.1f);
      add(p + "self_attn.k_norm.weight", {head_dim}, 1.0f, 0.1f);
    }
    add(p + "self_attn.o_proj.weight", {hidden, q}, 0, 0.05f);
    if (oss) {
      add(p + "self_attn.q_proj.bias", {q}, 0, 0.1f);
      add(p + "self_attn.k_proj.bias", {kv}, 0, 0.1f);
      add(p + "self_attn.v_proj.bias", {kv}, 0, 0.1f);
      add(p + "self_attn.o_proj.bias", {hidden}, 0, 0.1f);
      add(p + "self_attn.sinks", {heads}, 0, 1.0f);
      add(p + "mlp.router.weight", {experts, hidden}, 0, 1.0f);
      add(p + "mlp.router.bias", {experts}, 0, 1.0f);
      // Wide enough that the clamp at 7 bites sometimes.
      add(p + "mlp.experts.gate_up_proj", {experts, hidden, 2 * inter}, 0, 0.3f);
      add(p + "mlp.experts.gate_up_proj_bias", {experts, 2 * inter}, 0, 0.5f);
      add(p + "mlp.experts.down_proj", {experts, inter, hidden}, 0, 0.02f);
      add(p + "mlp.experts.down_proj_bias", {experts, hidden}, 0, 0.1f);
      continue;
    }
    if (qwen3 && l == 1) {  // mlp_only_layers
      add(p + "mlp.gate_proj.weight", {inter, hidden}, 0, 0.06f);
      add(p + "mlp.up_proj.weight", {inter, hidden}, 0, 0.06f);
      add(p + "mlp.down_proj.weight", {hidden, inter}, 0, 0.04f);
      continue;
    }
    const std::string b = p + (qwen3 ? "mlp." : "block_sparse_moe.");
    add(b + "gate.weight", {experts, hidden}, 0, 1.0f);
    for (int e = 0; e < experts; ++e) {
      const std::string ep = b + "experts." + std::to_string(e) + ".";
      add(ep + (qwen3 ? "gate_proj" : "w1") + ".weight", {moe_inter, hidden}, 0, 0.06f);
      add(ep + (qwen3 ? "up_proj" : "w3") + ".weight", {moe_inter, hidden}, 0, 0.06f);
      add(ep + (qwen3 ? "down_proj" : "w2") + ".weight", {hidden, moe_inter}, 0,
          qwen3 ? 0.08f : 0.04f);
    }
  }
  add("model.norm.weight", {hidden}, 1.0f, 0.1f);
  add("lm_head.weight", {vocab, hidden}, 0, 1.0f);  // wide: top-2 gaps well above bf16 rounding
  REQUIRE(WriteSafetensors((dir / "model.safetensors").string(), ts).ok());
  return dir.string();
}

}  // namespace llm::gpu_test
