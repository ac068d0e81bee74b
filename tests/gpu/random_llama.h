// Small random bf16 checkpoints for the whole-model GPU tests.
#pragma once

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/dtype.h"
#include "engine/loader/safetensors.h"

namespace llm::gpu_test {

// A bf16 tensor of normal(mean, std) values, for a random checkpoint.
inline TensorToWrite RandomBf16Tensor(const std::string& name, std::vector<int64_t> shape,
                                      float mean, float std, std::mt19937& rng) {
  TensorToWrite t{name, DType::kBF16, shape, {}};
  int64_t e = 1;
  for (int64_t d : shape) e *= d;
  t.data.resize(e * 2);
  std::normal_distribution<float> nd(mean, std);
  auto* p = reinterpret_cast<uint16_t*>(t.data.data());
  for (int64_t i = 0; i < e; ++i) p[i] = F32ToBf16(nd(rng));
  return t;
}

// The dense architectures WriteRandomDense writes.
enum class RandomArch { kLlama, kQwen2, kQwen3, kGemma2, kGemma3 };

// A random bf16 dense decoder in the HF layout: Llama (llama3 rope scaling), Qwen2 (q/k/v
// biases), Qwen3 (per-head q/k norms), Gemma 2 ((1 + w) norms, four per layer, GeGLU, embedding
// scale, a small attention soft-cap so that it bends the scores, the final logit soft-cap, layers
// 0 and 2 sliding over 8 keys) or Gemma 3 (the same layers without soft-caps, with q/k norms and
// their own rope theta on the sliding layers); with `window` > 0 a Mistral whose every layer
// attends to the last `window` positions.
inline std::string WriteRandomDense(const std::string& name, RandomArch arch, int head_dim = 64,
                                    int window = 0) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("llm_gpu_model_" + name);
  fs::create_directories(dir);
  const bool qwen2 = arch == RandomArch::kQwen2, qwen3 = arch == RandomArch::kQwen3;
  const bool gemma2 = arch == RandomArch::kGemma2, gemma3 = arch == RandomArch::kGemma3;
  const bool gemma = gemma2 || gemma3;
  const int hidden = 256, heads = 4, kv_heads = 2, inter = 512, layers = 3, vocab = 600;
  const char* arch_name = qwen2   ? "Qwen2ForCausalLM"
                          : qwen3 ? "Qwen3ForCausalLM"
                                  : "LlamaForCausalLM";
  nlohmann::json cfg = {{"architectures", {arch_name}},
                        {"hidden_size", hidden},
                        {"intermediate_size", inter},
                        {"num_hidden_layers", layers},
                        {"num_attention_heads", heads},
                        {"num_key_value_heads", kv_heads},
                        {"head_dim", head_dim},
                        {"vocab_size", vocab},
                        {"max_position_embeddings", 2048},
                        {"rms_norm_eps", 1e-5},
                        {"rope_theta", 10000.0},
                        {"tie_word_embeddings", false},
                        {"torch_dtype", "bfloat16"}};
  if (gemma) {
    cfg["architectures"] = {gemma2 ? "Gemma2ForCausalLM" : "Gemma3ForCausalLM"};
    cfg["model_type"] = gemma2 ? "gemma2" : "gemma3_text";
    cfg["hidden_activation"] = "gelu_pytorch_tanh";
    cfg["query_pre_attn_scalar"] = head_dim;
    cfg["sliding_window"] = 8;
    cfg["layer_types"] = {"sliding_attention", "full_attention", "sliding_attention"};
    cfg["rms_norm_eps"] = 1e-6;
    if (gemma2) {
      cfg["attn_logit_softcapping"] = 2.0;
      cfg["final_logit_softcapping"] = 30.0;
    } else {
      cfg["attn_logit_softcapping"] = nullptr;
      cfg["final_logit_softcapping"] = nullptr;
      cfg["rope_theta"] = 1000000.0;
      cfg["rope_local_base_freq"] = 10000.0;
    }
  } else if (window > 0) {
    cfg["architectures"] = {"MistralForCausalLM"};
    cfg["sliding_window"] = window;
  } else if (arch == RandomArch::kLlama) {
    cfg["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", 8.0},
                           {"low_freq_factor", 1.0},
                           {"high_freq_factor", 4.0},
                           {"original_max_position_embeddings", 128}};
  }
  std::ofstream(dir / "config.json") << cfg.dump();
  std::mt19937 rng(qwen2 ? 7 : qwen3 ? 5 : gemma2 ? 9 : gemma3 ? 10 : 3);
  const float norm_mean = gemma ? 0.0f : 1.0f;  // Gemma's norms scale by (1 + w)
  std::vector<TensorToWrite> ts;
  auto add = [&](const std::string& n, std::vector<int64_t> shape, float mean, float std) {
    ts.push_back(RandomBf16Tensor(n, std::move(shape), mean, std, rng));
  };
  const int64_t q = heads * head_dim, kv = kv_heads * head_dim;
  // Gemma scales the embedding by sqrt(hidden) = 16: rows of std 1/16 keep the token's own
  // embedding from drowning the layers' contributions (the next token would follow the input).
  add("model.embed_tokens.weight", {vocab, hidden}, 0, gemma ? 1.0f / 16 : 1.0f);
  for (int l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {hidden}, norm_mean, 0.1f);
    add(p + "post_attention_layernorm.weight", {hidden}, norm_mean, 0.1f);
    if (gemma) {
      add(p + "pre_feedforward_layernorm.weight", {hidden}, norm_mean, 0.1f);
      add(p + "post_feedforward_layernorm.weight", {hidden}, norm_mean, 0.1f);
    }
    add(p + "self_attn.q_proj.weight", {q, hidden}, 0, 0.08f);
    add(p + "self_attn.k_proj.weight", {kv, hidden}, 0, 0.08f);
    add(p + "self_attn.v_proj.weight", {kv, hidden}, 0, 0.08f);
    if (qwen2) {
      add(p + "self_attn.q_proj.bias", {q}, 0, 0.1f);
      add(p + "self_attn.k_proj.bias", {kv}, 0, 0.1f);
      add(p + "self_attn.v_proj.bias", {kv}, 0, 0.1f);
    }
    if (qwen3 || gemma3) {
      add(p + "self_attn.q_norm.weight", {head_dim}, norm_mean, 0.1f);
      add(p + "self_attn.k_norm.weight", {head_dim}, norm_mean, 0.1f);
    }
    add(p + "self_attn.o_proj.weight", {hidden, q}, 0, 0.05f);
    add(p + "mlp.gate_proj.weight", {inter, hidden}, 0, 0.06f);
    add(p + "mlp.up_proj.weight", {inter, hidden}, 0, 0.06f);
    add(p + "mlp.down_proj.weight", {hidden, inter}, 0, 0.04f);
  }
  add("model.norm.weight", {hidden}, norm_mean, 0.1f);
  // A wide head keeps the top-2 logit gaps of a random model well above bf16 rounding, so greedy
  // paths can be compared token for token.
  add("lm_head.weight", {vocab, hidden}, 0, 1.0f);
  REQUIRE(WriteSafetensors((dir / "model.safetensors").string(), ts).ok());
  return dir.string();
}

// A random bf16 Llama (or Qwen2) with head_dim 64; with `window` > 0 a Mistral.
inline std::string WriteRandomLlama(const std::string& name, bool qwen2 = false, int window = 0) {
  return WriteRandomDense(name, qwen2 ? RandomArch::kQwen2 : RandomArch::kLlama, 64, window);
}

}  // namespace llm::gpu_test
