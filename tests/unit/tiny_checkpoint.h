// Tiny Hugging Face checkpoints written by the tests: a config.json object and fp32 tensors with
// deterministic random values, editable before they are written (to break them on purpose).
#pragma once

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/loader/safetensors.h"

namespace llm::test {

struct TinyCheckpoint {
  nlohmann::json config;
  std::vector<TensorToWrite> tensors;

  TensorToWrite* Find(const std::string& name) {
    for (auto& t : tensors) {
      if (t.name == name) return &t;
    }
    return nullptr;
  }
  void Remove(const std::string& name) {
    std::erase_if(tensors, [&](const TensorToWrite& t) { return t.name == name; });
  }
  void AddF32(const std::string& name, std::vector<int64_t> shape, float mean, float std,
              uint32_t seed) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(mean, std);
    std::vector<float> v(n);
    for (float& x : v) x = std == 0.0f ? mean : nd(rng);
    TensorToWrite t{name, DType::kF32, std::move(shape), std::vector<std::byte>(n * 4)};
    std::memcpy(t.data.data(), v.data(), n * 4);
    tensors.push_back(std::move(t));
  }
  // The pieces every tiny decoder shares, each tensor seeded by the next *seed.
  void AddLayerNorms(const std::string& layer, int hidden, uint32_t* seed) {
    AddF32(layer + "input_layernorm.weight", {hidden}, 1, 0.1f, ++*seed);
    AddF32(layer + "post_attention_layernorm.weight", {hidden}, 1, 0.1f, ++*seed);
  }
  void AddGatedMlp(const std::string& layer, int hidden, int inter, uint32_t* seed) {
    AddF32(layer + "mlp.gate_proj.weight", {inter, hidden}, 0, 0.3f, ++*seed);
    AddF32(layer + "mlp.up_proj.weight", {inter, hidden}, 0, 0.3f, ++*seed);
    AddF32(layer + "mlp.down_proj.weight", {hidden, inter}, 0, 0.3f, ++*seed);
  }
  void AddFinalNormAndHead(int hidden, int vocab, uint32_t* seed) {
    AddF32("model.norm.weight", {hidden}, 1, 0.1f, ++*seed);
    AddF32("lm_head.weight", {vocab, hidden}, 0, 1.0f, ++*seed);
  }
  std::vector<float> F32(const std::string& name) {
    TensorToWrite* t = Find(name);
    std::vector<float> v(t->data.size() / 4);
    std::memcpy(v.data(), t->data.data(), t->data.size());
    return v;
  }
  void Write(const std::filesystem::path& dir) const {
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "config.json", std::ios::trunc) << config.dump(2);
    REQUIRE(WriteSafetensors((dir / "model.safetensors").string(), tensors).ok());
  }
};

// The sizes of a TinyLlama (its defaults: the families' tiny targets).
struct TinyLlamaShape {
  int h = 32, heads = 4, kv_heads = 2, d = 8, inter = 48, layers = 2, vocab = 64;
};

// Llama-family decoder: arch "llama", "qwen2" (q/k/v biases) or "mistral".
inline TinyCheckpoint TinyLlama(const std::string& arch, uint32_t seed = 1,
                                const TinyLlamaShape& shape = {}) {
  const int h = shape.h, heads = shape.heads, kv_heads = shape.kv_heads, d = shape.d;
  const int inter = shape.inter, layers = shape.layers, vocab = shape.vocab;
  TinyCheckpoint c;
  const std::string name = arch == "qwen2"     ? "Qwen2ForCausalLM"
                           : arch == "mistral" ? "MistralForCausalLM"
                                               : "LlamaForCausalLM";
  c.config = {{"architectures", {name}},
              {"model_type", arch},
              {"hidden_size", h},
              {"intermediate_size", inter},
              {"num_hidden_layers", layers},
              {"num_attention_heads", heads},
              {"num_key_value_heads", kv_heads},
              {"head_dim", d},
              {"vocab_size", vocab},
              {"max_position_embeddings", 256},
              {"rms_norm_eps", 1e-5},
              {"hidden_act", "silu"},
              {"tie_word_embeddings", false},
              {"bos_token_id", 0},
              {"eos_token_id", 1}};
  uint32_t s = seed * 1000;
  c.AddF32("model.embed_tokens.weight", {vocab, h}, 0, 1.0f, ++s);
  for (int l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    c.AddLayerNorms(p, h, &s);
    c.AddF32(p + "self_attn.q_proj.weight", {heads * d, h}, 0, 0.3f, ++s);
    c.AddF32(p + "self_attn.k_proj.weight", {kv_heads * d, h}, 0, 0.3f, ++s);
    c.AddF32(p + "self_attn.v_proj.weight", {kv_heads * d, h}, 0, 0.3f, ++s);
    c.AddF32(p + "self_attn.o_proj.weight", {h, heads * d}, 0, 0.3f, ++s);
    if (arch == "qwen2") {
      c.AddF32(p + "self_attn.q_proj.bias", {heads * d}, 0, 0.3f, ++s);
      c.AddF32(p + "self_attn.k_proj.bias", {kv_heads * d}, 0, 0.3f, ++s);
      c.AddF32(p + "self_attn.v_proj.bias", {kv_heads * d}, 0, 0.3f, ++s);
    }
    c.AddGatedMlp(p, h, inter, &s);
  }
  c.AddFinalNormAndHead(h, vocab, &s);
  return c;
}

// Dense DeepSeek-V2 (MLA, no experts), rope part of 8 dimensions.
inline TinyCheckpoint TinyDeepseekV2(uint32_t seed = 3) {
  const int h = 32, heads = 2, kv_lora = 16, rope = 8, nope = 8, vdim = 8, layers = 2;
  const int inter = 32, vocab = 64;
  TinyCheckpoint c;
  c.config = {{"architectures", {"DeepseekV2ForCausalLM"}},
              {"model_type", "deepseek_v2"},
              {"hidden_size", h},
              {"intermediate_size", inter},
              {"num_hidden_layers", layers},
              {"num_attention_heads", heads},
              {"num_key_value_heads", heads},
              {"q_lora_rank", nullptr},
              {"kv_lora_rank", kv_lora},
              {"qk_rope_head_dim", rope},
              {"qk_nope_head_dim", nope},
              {"v_head_dim", vdim},
              {"n_routed_experts", nullptr},
              {"hidden_act", "silu"},
              {"rms_norm_eps", 1e-6},
              {"vocab_size", vocab},
              {"max_position_embeddings", 256},
              {"tie_word_embeddings", false},
              {"bos_token_id", 0},
              {"eos_token_id", 1}};
  uint32_t s = seed * 1000;
  c.AddF32("model.embed_tokens.weight", {vocab, h}, 0, 1.0f, ++s);
  for (int l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const std::string a = p + "self_attn.";
    c.AddLayerNorms(p, h, &s);
    c.AddF32(a + "q_proj.weight", {heads * (nope + rope), h}, 0, 0.3f, ++s);
    c.AddF32(a + "kv_a_proj_with_mqa.weight", {kv_lora + rope, h}, 0, 0.3f, ++s);
    c.AddF32(a + "kv_a_layernorm.weight", {kv_lora}, 1, 0.1f, ++s);
    c.AddF32(a + "kv_b_proj.weight", {heads * (nope + vdim), kv_lora}, 0, 0.3f, ++s);
    c.AddF32(a + "o_proj.weight", {h, heads * vdim}, 0, 0.3f, ++s);
    c.AddGatedMlp(p, h, inter, &s);
  }
  c.AddFinalNormAndHead(h, vocab, &s);
  return c;
}

// How AddTinyDeepseekMoeTensors draws a checkpoint's tensors: weights N(0, std) (norms 1 +
// N(0, 0.1)), routers N(0, router_std), V3's e_score_correction_bias N(0, router_bias_std) when
// that is at least 0 (else none), seeds seed + 1, seed + 2, ... in tensor order.
struct TinyDeepseekMoeInit {
  float std = 0.3f;
  float router_std = 0.5f;
  float router_bias_std = -1.0f;
  uint32_t seed = 0;
};

// The tensors of a tiny DeepSeek V2 / V3 MoE checkpoint shaped from c->config: MLA attention
// (q_proj, or q_a / q_b when q_lora_rank is set), first_k_dense_replace dense layers of
// intermediate_size, then MoE layers of n_routed_experts experts and n_shared_experts shared
// experts of moe_intermediate_size each, untied embeddings.
inline void AddTinyDeepseekMoeTensors(TinyCheckpoint* c, const TinyDeepseekMoeInit& init) {
  const nlohmann::json& j = c->config;
  const int hidden = j["hidden_size"], heads = j["num_attention_heads"];
  const int kv_lora = j["kv_lora_rank"], rope = j["qk_rope_head_dim"];
  const int nope = j["qk_nope_head_dim"], vdim = j["v_head_dim"];
  const int q_lora = j["q_lora_rank"].is_null() ? 0 : j["q_lora_rank"].get<int>();
  const int layers = j["num_hidden_layers"], dense = j["first_k_dense_replace"];
  const int inter = j["intermediate_size"], moe_inter = j["moe_intermediate_size"];
  const int experts = j["n_routed_experts"], shared = j["n_shared_experts"];
  const int vocab = j["vocab_size"];
  uint32_t seed = init.seed;
  auto add = [&](const std::string& n, std::vector<int64_t> shape, float mean, float std) {
    c->AddF32(n, std::move(shape), mean, std, ++seed);
  };
  auto mlp = [&](const std::string& p, int n) {
    add(p + "gate_proj.weight", {n, hidden}, 0, init.std);
    add(p + "up_proj.weight", {n, hidden}, 0, init.std);
    add(p + "down_proj.weight", {hidden, n}, 0, init.std);
  };
  add("model.embed_tokens.weight", {vocab, hidden}, 0, 1.0f);
  for (int l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const std::string a = p + "self_attn.";
    add(p + "input_layernorm.weight", {hidden}, 1, 0.1f);
    add(p + "post_attention_layernorm.weight", {hidden}, 1, 0.1f);
    if (q_lora > 0) {
      add(a + "q_a_proj.weight", {q_lora, hidden}, 0, init.std);
      add(a + "q_a_layernorm.weight", {q_lora}, 1, 0.1f);
      add(a + "q_b_proj.weight", {heads * (nope + rope), q_lora}, 0, init.std);
    } else {
      add(a + "q_proj.weight", {heads * (nope + rope), hidden}, 0, init.std);
    }
    add(a + "kv_a_proj_with_mqa.weight", {kv_lora + rope, hidden}, 0, init.std);
    add(a + "kv_a_layernorm.weight", {kv_lora}, 1, 0.1f);
    add(a + "kv_b_proj.weight", {heads * (nope + vdim), kv_lora}, 0, init.std);
    add(a + "o_proj.weight", {hidden, heads * vdim}, 0, init.std);
    if (l < dense) {
      mlp(p + "mlp.", inter);
      continue;
    }
    add(p + "mlp.gate.weight", {experts, hidden}, 0, init.router_std);
    if (init.router_bias_std >= 0) {
      add(p + "mlp.gate.e_score_correction_bias", {experts}, 0, init.router_bias_std);
    }
    for (int e = 0; e < experts; ++e) mlp(p + "mlp.experts." + std::to_string(e) + ".", moe_inter);
    mlp(p + "mlp.shared_experts.", moe_inter * shared);
  }
  add("model.norm.weight", {hidden}, 1, 0.1f);
  add("lm_head.weight", {vocab, hidden}, 0, 1.0f);
}

class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() /
            ("llm_" + tag + "_" + std::to_string(getpid()) + "_" + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::filesystem::path path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace llm::test
