// Small random checkpoints for the whole-model GPU tests: RandomCheckpoint, the builder every
// random model shares (its directory, the config keys of the common shape, seeded tensors), and
// the bf16 dense decoders written with it.
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
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

// The shape of the random decoders: small, with grouped-query attention (two query heads per KV
// head) and a vocabulary wider than every test's token ids.
struct RandomShape {
  int hidden = 256, heads = 4, kv_heads = 2, head_dim = 64, inter = 512, layers = 3, vocab = 600;
};

// A random checkpoint in the HF layout under the temp folder: config.json starts with the keys
// every random decoder shares (a Llama's, to be overridden per architecture), and the tensors come
// from one generator seeded per model, in the order added, so a test sees the same model on every
// run.
class RandomCheckpoint {
 public:
  RandomCheckpoint(const std::string& name, const char* architecture, const RandomShape& shape,
                   uint32_t seed)
      : dir_(std::filesystem::temp_directory_path() / ("llm_gpu_model_" + name)),
        shape_(shape),
        rng_(seed) {
    config_ = {{"architectures", {architecture}},
               {"hidden_size", shape.hidden},
               {"intermediate_size", shape.inter},
               {"num_hidden_layers", shape.layers},
               {"num_attention_heads", shape.heads},
               {"num_key_value_heads", shape.kv_heads},
               {"head_dim", shape.head_dim},
               {"vocab_size", shape.vocab},
               {"max_position_embeddings", 2048},
               {"rms_norm_eps", 1e-5},
               {"rope_theta", 10000.0},
               {"tie_word_embeddings", false},
               {"torch_dtype", "bfloat16"}};
  }

  nlohmann::json& config() { return config_; }
  const RandomShape& shape() const { return shape_; }
  std::mt19937& rng() { return rng_; }
  std::vector<TensorToWrite>& tensors() { return tensors_; }
  // Query and KV projection widths.
  int64_t q_width() const { return static_cast<int64_t>(shape_.heads) * shape_.head_dim; }
  int64_t kv_width() const { return static_cast<int64_t>(shape_.kv_heads) * shape_.head_dim; }

  // A bf16 tensor of normal(mean, std) values.
  void Add(const std::string& name, std::vector<int64_t> shape, float mean, float std) {
    tensors_.push_back(RandomBf16Tensor(name, std::move(shape), mean, std, rng_));
  }

  // Writes config.json and model.safetensors; returns the directory.
  std::string Write() {
    std::filesystem::create_directories(dir_);
    std::ofstream(dir_ / "config.json") << config_.dump();
    REQUIRE(WriteSafetensors((dir_ / "model.safetensors").string(), tensors_).ok());
    return dir_.string();
  }

 private:
  std::filesystem::path dir_;
  RandomShape shape_;
  std::mt19937 rng_;
  nlohmann::json config_;
  std::vector<TensorToWrite> tensors_;
};

// The dense architectures WriteRandomDense writes.
enum class RandomArch { kLlama, kQwen2, kQwen3, kGemma2, kGemma3 };

// A random bf16 dense decoder in the HF layout: Llama (llama3 rope scaling), Qwen2 (q/k/v
// biases), Qwen3 (per-head q/k norms), Gemma 2 ((1 + w) norms, four per layer, GeGLU, embedding
// scale, a small attention soft-cap so that it bends the scores, the final logit soft-cap, layers
// 0 and 2 sliding over 8 keys) or Gemma 3 (the same layers without soft-caps, with q/k norms and
// their own rope theta on the sliding layers); with `window` > 0 a Mistral whose every layer
// attends to the last `window` positions. `heads` query heads over RandomShape's two KV heads;
// `vocab` rows of embedding and LM head.
inline std::string WriteRandomDense(const std::string& name, RandomArch arch, int head_dim = 64,
                                    int window = 0, int heads = 4, int vocab = 600) {
  const bool qwen2 = arch == RandomArch::kQwen2, qwen3 = arch == RandomArch::kQwen3;
  const bool gemma2 = arch == RandomArch::kGemma2, gemma3 = arch == RandomArch::kGemma3;
  const bool gemma = gemma2 || gemma3;
  const char* arch_name = qwen2   ? "Qwen2ForCausalLM"
                          : qwen3 ? "Qwen3ForCausalLM"
                                  : "LlamaForCausalLM";
  RandomCheckpoint ck(name, arch_name,
                      RandomShape{.heads = heads, .head_dim = head_dim, .vocab = vocab},
                      qwen2    ? 7
                      : qwen3  ? 5
                      : gemma2 ? 9
                      : gemma3 ? 10
                               : 3);
  nlohmann::json& cfg = ck.config();
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
  const RandomShape& s = ck.shape();
  const float norm_mean = gemma ? 0.0f : 1.0f;  // Gemma's norms scale by (1 + w)
  const int64_t q = ck.q_width(), kv = ck.kv_width();
  // Gemma scales the embedding by sqrt(hidden) = 16: rows of std 1/16 keep the token's own
  // embedding from drowning the layers' contributions (the next token would follow the input).
  ck.Add("model.embed_tokens.weight", {s.vocab, s.hidden}, 0, gemma ? 1.0f / 16 : 1.0f);
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    ck.Add(p + "input_layernorm.weight", {s.hidden}, norm_mean, 0.1f);
    ck.Add(p + "post_attention_layernorm.weight", {s.hidden}, norm_mean, 0.1f);
    if (gemma) {
      ck.Add(p + "pre_feedforward_layernorm.weight", {s.hidden}, norm_mean, 0.1f);
      ck.Add(p + "post_feedforward_layernorm.weight", {s.hidden}, norm_mean, 0.1f);
    }
    ck.Add(p + "self_attn.q_proj.weight", {q, s.hidden}, 0, 0.08f);
    ck.Add(p + "self_attn.k_proj.weight", {kv, s.hidden}, 0, 0.08f);
    ck.Add(p + "self_attn.v_proj.weight", {kv, s.hidden}, 0, 0.08f);
    if (qwen2) {
      ck.Add(p + "self_attn.q_proj.bias", {q}, 0, 0.1f);
      ck.Add(p + "self_attn.k_proj.bias", {kv}, 0, 0.1f);
      ck.Add(p + "self_attn.v_proj.bias", {kv}, 0, 0.1f);
    }
    if (qwen3 || gemma3) {
      ck.Add(p + "self_attn.q_norm.weight", {head_dim}, norm_mean, 0.1f);
      ck.Add(p + "self_attn.k_norm.weight", {head_dim}, norm_mean, 0.1f);
    }
    ck.Add(p + "self_attn.o_proj.weight", {s.hidden, q}, 0, 0.05f);
    ck.Add(p + "mlp.gate_proj.weight", {s.inter, s.hidden}, 0, 0.06f);
    ck.Add(p + "mlp.up_proj.weight", {s.inter, s.hidden}, 0, 0.06f);
    ck.Add(p + "mlp.down_proj.weight", {s.hidden, s.inter}, 0, 0.04f);
  }
  ck.Add("model.norm.weight", {s.hidden}, norm_mean, 0.1f);
  // A wide head keeps the top-2 logit gaps of a random model well above bf16 rounding, so greedy
  // paths can be compared token for token.
  ck.Add("lm_head.weight", {s.vocab, s.hidden}, 0, 1.0f);
  return ck.Write();
}

// A random bf16 Llama (or Qwen2) with head_dim 64; with `window` > 0 a Mistral.
inline std::string WriteRandomLlama(const std::string& name, bool qwen2 = false, int window = 0) {
  return WriteRandomDense(name, qwen2 ? RandomArch::kQwen2 : RandomArch::kLlama, 64, window);
}

}  // namespace llm::gpu_test
