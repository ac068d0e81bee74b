// Tests for LoadDeepseekConfig: V2/V3 fields and per-architecture defaults, YaRN (inv_freq bands,
// DeepSeek mscale on cos/sin and on the softmax scale), MoE layer placement, the latent cache
// extension keys, and errors that name the offending field.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/loader/deepseek_config.h"

namespace llm {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = fs::temp_directory_path() /
            ("llm_test_deepseek_config_" + std::to_string(getpid()) + "_" + std::to_string(rd()));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string path() const { return path_.string(); }
  void WriteConfig(const json& j) const { std::ofstream(path_ / "config.json") << j.dump(2); }

 private:
  fs::path path_;
};

// DeepSeek-V2-Lite-like config (real field names and values, fewer layers).
json V2Lite() {
  return json{{"architectures", json::array({"DeepseekV2ForCausalLM"})},
              {"hidden_size", 2048},
              {"intermediate_size", 10944},
              {"moe_intermediate_size", 1408},
              {"num_hidden_layers", 4},
              {"num_attention_heads", 16},
              {"num_key_value_heads", 16},
              {"q_lora_rank", nullptr},
              {"kv_lora_rank", 512},
              {"qk_rope_head_dim", 64},
              {"qk_nope_head_dim", 128},
              {"v_head_dim", 128},
              {"n_routed_experts", 64},
              {"n_shared_experts", 2},
              {"num_experts_per_tok", 6},
              {"routed_scaling_factor", 1.0},
              {"scoring_func", "softmax"},
              {"topk_method", "greedy"},
              {"n_group", 1},
              {"topk_group", 1},
              {"norm_topk_prob", false},
              {"first_k_dense_replace", 1},
              {"moe_layer_freq", 1},
              {"rope_theta", 10000},
              {"rope_scaling",
               {{"type", "yarn"},
                {"factor", 40},
                {"original_max_position_embeddings", 4096},
                {"beta_fast", 32},
                {"beta_slow", 1},
                {"mscale", 0.707},
                {"mscale_all_dim", 0.707}}},
              {"rms_norm_eps", 1e-6},
              {"vocab_size", 102400},
              {"max_position_embeddings", 163840},
              {"tie_word_embeddings", false},
              {"bos_token_id", 100000},
              {"eos_token_id", 100001},
              {"torch_dtype", "bfloat16"}};
}

bool Contains(const std::string& s, const std::string& needle) {
  return s.find(needle) != std::string::npos;
}

TEST_CASE("DeepSeek-V2 config: fields, yarn, MoE placement", "[deepseek_config]") {
  TempDir dir;
  dir.WriteConfig(V2Lite());
  REQUIRE(IsDeepseekModelDir(dir.path()));
  auto c = LoadDeepseekConfig(dir.path());
  REQUIRE(c.ok());
  CHECK(c->base.architecture == Architecture::kDeepseekV2);
  CHECK(std::string(ArchitectureName(c->base.architecture)) == "DeepseekV2ForCausalLM");
  CHECK(c->q_lora_rank == 0);
  CHECK(c->latent_dim() == 576);
  CHECK(c->qk_head_dim() == 192);
  CHECK(c->base.head_dim == 192);
  CHECK(c->n_routed_experts == 64);
  CHECK(c->n_shared_experts == 2);
  CHECK(c->topk_method == DeepseekConfig::TopkMethod::kGreedy);
  CHECK(c->scoring == DeepseekConfig::Scoring::kSoftmax);
  CHECK_FALSE(c->IsMoeLayer(0));
  CHECK(c->IsMoeLayer(1));
  CHECK(c->base.max_position_embeddings == 163840);
  CHECK(c->base.eos_token_ids == std::vector<int32_t>{100001});
  CHECK(c->mla_cache_dtype == DType::kF32);
  // mscale == mscale_all_dim: cos/sin unscaled, softmax scale * (0.1 * 0.707 * ln 40 + 1)^2.
  CHECK(c->RopeMscale() == Approx(1.0f));
  const double m = 0.1 * 0.707 * std::log(40.0) + 1.0;
  CHECK(c->SoftmaxScale() == Approx(m * m / std::sqrt(192.0)).epsilon(1e-6));
  // YaRN bands at d=64, base 1e4, original 4096: low = floor(10.47) = 10, high = ceil(22.51) = 23.
  const std::vector<float> inv = c->RopeInvFreq();
  REQUIRE(inv.size() == 32);
  for (int i = 0; i < 32; ++i) {
    const double extra = 1.0 / std::pow(10000.0, 2.0 * i / 64);
    if (i <= 10) CHECK(inv[i] == Approx(extra).epsilon(1e-6));
    if (i >= 23) CHECK(inv[i] == Approx(extra / 40).epsilon(1e-6));
    if (i > 10 && i < 23) {
      CHECK(inv[i] < extra);
      CHECK(inv[i] > extra / 40);
    }
  }
}

TEST_CASE("DeepSeek yarn with truncate false", "[deepseek_config]") {
  // transformers' _compute_yarn_parameters with truncate = false: the correction range's bounds
  // stay unrounded, low = 64 ln(4096 / (32 * 2 pi)) / (2 ln 1e4) = 10.47..., high (beta_slow 1)
  // = 22.51...; inv_freq = extra * (1 - ramp) + extra / factor * ramp, ramp = clamp((i - low) /
  // (high - low), 0, 1).
  TempDir dir;
  json j = V2Lite();
  j["rope_scaling"]["truncate"] = false;
  dir.WriteConfig(j);
  auto c = LoadDeepseekConfig(dir.path());
  REQUIRE(c.ok());
  CHECK_FALSE(c->yarn.freq.truncate);
  const double low = 64 * std::log(4096 / (32 * 2 * M_PI)) / (2 * std::log(10000.0));
  const double high = 64 * std::log(4096 / (1 * 2 * M_PI)) / (2 * std::log(10000.0));
  REQUIRE(low == Approx(10.47).margin(0.01));
  REQUIRE(high == Approx(22.51).margin(0.01));
  const std::vector<float> inv = c->RopeInvFreq();
  REQUIRE(inv.size() == 32);
  for (int i = 0; i < 32; ++i) {
    CAPTURE(i);
    const double extra = 1.0 / std::pow(10000.0, 2.0 * i / 64);
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    CHECK(inv[i] == Approx(extra * (1 - ramp) + extra / 40 * ramp).epsilon(1e-6));
  }
  // Not the rounded range [10, 23]: i = 11 sits at ramp 0.044 here, 1/13 = 0.077 with truncate.
  j["rope_scaling"].erase("truncate");
  dir.WriteConfig(j);
  auto rounded = LoadDeepseekConfig(dir.path());
  REQUIRE(rounded.ok());
  CHECK(rounded->yarn.freq.truncate);
  CHECK(rounded->RopeInvFreq()[11] != Approx(inv[11]).epsilon(1e-4));
}

TEST_CASE("DeepSeek-V3 config: defaults and noaux_tc", "[deepseek_config]") {
  TempDir dir;
  json j = V2Lite();
  j["architectures"] = json::array({"DeepseekV3ForCausalLM"});
  for (const char* k : {"scoring_func", "topk_method", "n_group", "topk_group", "norm_topk_prob",
                        "routed_scaling_factor"}) {
    j.erase(k);
  }
  j["q_lora_rank"] = 1536;
  j["rope_scaling"]["mscale"] = 1.0;
  j["rope_scaling"]["mscale_all_dim"] = 0.8;
  dir.WriteConfig(j);
  auto c = LoadDeepseekConfig(dir.path());
  REQUIRE(c.ok());
  CHECK(c->is_v3());
  CHECK(c->q_lora_rank == 1536);
  // HF DeepseekV3Config defaults.
  CHECK(c->scoring == DeepseekConfig::Scoring::kSigmoid);
  CHECK(c->topk_method == DeepseekConfig::TopkMethod::kNoauxTc);
  CHECK(c->n_group == 8);
  CHECK(c->topk_group == 4);
  CHECK(c->norm_topk_prob);
  CHECK(c->routed_scaling_factor == Approx(2.5f));
  const double num = 0.1 * 1.0 * std::log(40.0) + 1.0, den = 0.1 * 0.8 * std::log(40.0) + 1.0;
  CHECK(c->RopeMscale() == Approx(num / den).epsilon(1e-6));
  CHECK(c->SoftmaxScale() == Approx(den * den / std::sqrt(192.0)).epsilon(1e-6));
}

TEST_CASE("DeepSeek config extensions and errors", "[deepseek_config]") {
  TempDir dir;
  SECTION("fp8 latent cache keys") {
    json j = V2Lite();
    j["mla_cache_dtype"] = "fp8_e4m3";
    j["mla_cache_scale"] = 0.05;
    dir.WriteConfig(j);
    auto c = LoadDeepseekConfig(dir.path());
    REQUIRE(c.ok());
    CHECK(c->mla_cache_dtype == DType::kFp8E4M3);
    CHECK(c->mla_cache_scale == Approx(0.05f));
  }
  SECTION("no rope scaling, dense only, moe_layer_freq") {
    json j = V2Lite();
    j["rope_scaling"] = nullptr;
    j["moe_layer_freq"] = 2;
    j["first_k_dense_replace"] = 0;
    dir.WriteConfig(j);
    auto c = LoadDeepseekConfig(dir.path());
    REQUIRE(c.ok());
    CHECK_FALSE(c->yarn.enabled());
    CHECK(c->RopeMscale() == 1.0f);
    CHECK(c->SoftmaxScale() == Approx(1.0 / std::sqrt(192.0)));
    CHECK(c->IsMoeLayer(0));
    CHECK_FALSE(c->IsMoeLayer(1));
    CHECK(c->IsMoeLayer(2));
  }
  struct Bad {
    const char* what;
    std::function<void(json&)> edit;
    StatusCode code;
    const char* mention;
  };
  const std::vector<Bad> bad = {
      {"missing kv_lora_rank", [](json& j) { j.erase("kv_lora_rank"); },
       StatusCode::kInvalidArgument, "kv_lora_rank"},
      {"odd rope dim", [](json& j) { j["qk_rope_head_dim"] = 63; }, StatusCode::kInvalidArgument,
       "qk_rope_head_dim"},
      {"unknown topk_method", [](json& j) { j["topk_method"] = "magic"; },
       StatusCode::kUnimplemented, "magic"},
      {"unknown scoring", [](json& j) { j["scoring_func"] = "relu"; }, StatusCode::kUnimplemented,
       "relu"},
      {"groups do not divide experts",
       [](json& j) {
         j["topk_method"] = "group_limited_greedy";
         j["n_group"] = 5;
       },
       StatusCode::kInvalidArgument, "n_group"},
      {"linear rope scaling",
       [](json& j) {
         j["rope_scaling"] = {{"type", "linear"}, {"factor", 2}};
       },
       StatusCode::kUnimplemented, "linear"},
      {"bad cache dtype", [](json& j) { j["mla_cache_dtype"] = "int8"; },
       StatusCode::kInvalidArgument, "mla_cache_dtype"},
      {"top-k above experts", [](json& j) { j["num_experts_per_tok"] = 65; },
       StatusCode::kInvalidArgument, "num_experts_per_tok"},
      {"attention bias", [](json& j) { j["attention_bias"] = true; }, StatusCode::kUnimplemented,
       "attention_bias"},
      {"yarn attention_factor", [](json& j) { j["rope_scaling"]["attention_factor"] = 1.2; },
       StatusCode::kUnimplemented, "attention_factor"},
  };
  for (const Bad& b : bad) {
    CAPTURE(b.what);
    json j = V2Lite();
    b.edit(j);
    dir.WriteConfig(j);
    auto c = LoadDeepseekConfig(dir.path());
    REQUIRE_FALSE(c.ok());
    CHECK(c.status().code() == b.code);
    CHECK(Contains(c.status().message(), b.mention));
  }
  SECTION("a Llama directory is not DeepSeek") {
    json j = V2Lite();
    j["architectures"] = json::array({"LlamaForCausalLM"});
    dir.WriteConfig(j);
    CHECK_FALSE(IsDeepseekModelDir(dir.path()));
    CHECK_FALSE(IsDeepseekModelDir(dir.path() + "/missing"));
  }
}

}  // namespace
}  // namespace llm
