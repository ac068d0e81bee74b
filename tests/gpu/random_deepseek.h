// A small random DeepSeek-V2 / V3 checkpoint for the whole-model GPU tests (the DeepSeek tests and
// the speculative verify-graph tests).
#pragma once

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/loader/safetensors.h"
#include "tests/gpu/random_fp8_llama.h"
#include "tests/gpu/random_llama.h"

namespace llm::gpu_test {

inline constexpr int kRandomDeepseekVocab = 600;
inline constexpr int kRandomDeepseekLayers = 3;  // layer 0 dense, 1 and 2 MoE

// A random bf16 DeepSeek in the HF layout. The cuda_mla kernel fixes kv_lora_rank 512 and rope 64;
// the other dims are small. 3 layers: layer 0 dense, layers 1-2 MoE (8 experts, top-2, 4 groups
// of which 2 are kept, 1 shared expert). v3: no q LoRA, sigmoid + noaux_tc with a correction
// bias, normalized weights times 2.5; else V2: q LoRA, softmax + group_limited_greedy.
// dense_only: every layer dense (first_k_dense_replace = num_layers), no expert tensors.
// fp8_block: every linear weight but the router's and the LM head's stored as DeepSeek-V3 does
// (e4m3 with 128x128 block weight_scale_inv, quant_method fp8), experts of 128 rows (whole blocks
// where gate and up are stacked); V3 only (V2's q_a_proj of 96 rows is not whole 128-row blocks
// above kv_a_proj in the stacked projection). moe_inter_size: the experts' intermediate size
// (0: 128 with fp8_block, else 64).
inline std::string WriteRandomDeepseek(const std::string& name, bool v3, const char* cache_dtype,
                                       bool dense_only = false, bool fp8_block = false,
                                       int moe_inter_size = 0) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("llm_gpu_deepseek_" + name);
  fs::create_directories(dir);
  const int hidden = 256, heads = 16, kv_lora = 512, rope = 64, nope = 32, vdim = 32;
  const int layers = kRandomDeepseekLayers, inter = 256,
            moe_inter = moe_inter_size > 0 ? moe_inter_size
                        : fp8_block        ? 128
                                           : 64,
            experts = 8, q_lora = v3 ? 0 : 96;
  nlohmann::json cfg = {{"architectures", {v3 ? "DeepseekV3ForCausalLM" : "DeepseekV2ForCausalLM"}},
                        {"model_type", v3 ? "deepseek_v3" : "deepseek_v2"},
                        {"hidden_size", hidden},
                        {"intermediate_size", inter},
                        {"moe_intermediate_size", moe_inter},
                        {"num_hidden_layers", layers},
                        {"num_attention_heads", heads},
                        {"num_key_value_heads", heads},
                        {"q_lora_rank", v3 ? nlohmann::json(nullptr) : nlohmann::json(q_lora)},
                        {"kv_lora_rank", kv_lora},
                        {"qk_rope_head_dim", rope},
                        {"qk_nope_head_dim", nope},
                        {"v_head_dim", vdim},
                        {"n_routed_experts", experts},
                        {"n_shared_experts", 1},
                        {"num_experts_per_tok", 2},
                        {"routed_scaling_factor", v3 ? 2.5 : 1.0},
                        {"scoring_func", v3 ? "sigmoid" : "softmax"},
                        {"topk_method", v3 ? "noaux_tc" : "group_limited_greedy"},
                        {"n_group", 4},
                        {"topk_group", 2},
                        {"norm_topk_prob", v3},
                        {"first_k_dense_replace", dense_only ? layers : 1},
                        {"moe_layer_freq", 1},
                        {"hidden_act", "silu"},
                        {"rope_theta", 10000.0},
                        {"rope_scaling",
                         {{"type", "yarn"},
                          {"factor", 4.0},
                          {"original_max_position_embeddings", 32},
                          {"beta_fast", 32},
                          {"beta_slow", 1},
                          {"mscale", v3 ? 1.0 : 0.707},
                          {"mscale_all_dim", v3 ? 0.8 : 0.707}}},
                        {"rms_norm_eps", 1e-6},
                        {"vocab_size", kRandomDeepseekVocab},
                        {"max_position_embeddings", 4096},
                        {"tie_word_embeddings", false},
                        {"attention_bias", false},
                        {"torch_dtype", "bfloat16"},
                        {"bos_token_id", 0},
                        {"eos_token_id", 1}};
  if (cache_dtype) cfg["mla_cache_dtype"] = cache_dtype;
  if (fp8_block) cfg["quantization_config"] = Fp8QuantizationConfig(Fp8Format::kBlock128);
  std::ofstream(dir / "config.json") << cfg.dump();
  std::mt19937 rng(v3 ? 31 : 17);
  std::vector<TensorToWrite> ts;
  auto add = [&](const std::string& n, std::vector<int64_t> shape, float mean, float std) {
    const std::string suffix = ".weight";
    const bool linear = shape.size() == 2 && n.size() > suffix.size() &&
                        n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0 &&
                        n.find("embed_tokens") == std::string::npos &&
                        n.find("lm_head") == std::string::npos &&
                        n.find("mlp.gate.") == std::string::npos;
    if (!fp8_block || !linear) {
      ts.push_back(RandomBf16Tensor(n, std::move(shape), mean, std, rng));
      return;
    }
    std::normal_distribution<float> nd(mean, std);
    std::vector<float> w(static_cast<size_t>(shape[0] * shape[1]));
    for (auto& v : w) v = nd(rng);
    AddFp8Linear(&ts, n.substr(0, n.size() - suffix.size()), Fp8Format::kBlock128, shape[0],
                 shape[1], w, 0.f);
  };
  auto mlp = [&](const std::string& p, int n) {
    add(p + "gate_proj.weight", {n, hidden}, 0, 0.06f);
    add(p + "up_proj.weight", {n, hidden}, 0, 0.06f);
    add(p + "down_proj.weight", {hidden, n}, 0, 0.06f);
  };
  const int64_t qk = nope + rope;
  add("model.embed_tokens.weight", {kRandomDeepseekVocab, hidden}, 0, 1.0f);
  for (int l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const std::string a = p + "self_attn.";
    add(p + "input_layernorm.weight", {hidden}, 1, 0.1f);
    add(p + "post_attention_layernorm.weight", {hidden}, 1, 0.1f);
    if (v3) {
      add(a + "q_proj.weight", {heads * qk, hidden}, 0, 0.06f);
    } else {
      add(a + "q_a_proj.weight", {q_lora, hidden}, 0, 0.06f);
      add(a + "q_a_layernorm.weight", {q_lora}, 1, 0.1f);
      add(a + "q_b_proj.weight", {heads * qk, q_lora}, 0, 0.1f);
    }
    add(a + "kv_a_proj_with_mqa.weight", {kv_lora + rope, hidden}, 0, 0.06f);
    add(a + "kv_a_layernorm.weight", {kv_lora}, 1, 0.1f);
    add(a + "kv_b_proj.weight", {heads * (nope + vdim), kv_lora}, 0, 0.05f);
    add(a + "o_proj.weight", {hidden, heads * vdim}, 0, 0.05f);
    if (l == 0 || dense_only) {
      mlp(p + "mlp.", inter);
      continue;
    }
    // Router logits of std ~2.4: routing varies from token to token.
    add(p + "mlp.gate.weight", {experts, hidden}, 0, 0.15f);
    if (v3) add(p + "mlp.gate.e_score_correction_bias", {experts}, 0, 0.1f);
    for (int e = 0; e < experts; ++e) mlp(p + "mlp.experts." + std::to_string(e) + ".", moe_inter);
    mlp(p + "mlp.shared_experts.", moe_inter);
  }
  add("model.norm.weight", {hidden}, 1, 0.1f);
  // A wide head keeps top-2 logit gaps well above bf16 rounding (as test_cuda_model.cc).
  add("lm_head.weight", {kRandomDeepseekVocab, hidden}, 0, 1.0f);
  REQUIRE(WriteSafetensors((dir / "model.safetensors").string(), ts).ok());
  return dir.string();
}

}  // namespace llm::gpu_test
