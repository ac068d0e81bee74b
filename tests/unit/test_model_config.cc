// Tests for LoadModelConfig: architectures, rope scaling, biases, sliding windows, eos ids from
// generation_config.json, and errors that name the offending field.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/loader/model_config.h"

namespace llm {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

class TempModelDir {
 public:
  TempModelDir() {
    std::random_device rd;
    path_ = fs::temp_directory_path() /
            ("llm_test_model_config_" + std::to_string(getpid()) + "_" + std::to_string(rd()));
    fs::create_directories(path_);
  }
  ~TempModelDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string path() const { return path_.string(); }
  void Write(const std::string& name, const std::string& text) const {
    std::ofstream out(path_ / name, std::ios::trunc);
    out << text;
  }
  void WriteConfig(const json& j) const { Write("config.json", j.dump(2)); }

 private:
  fs::path path_;
};

json BaseLlama() {
  return json{{"architectures", json::array({"LlamaForCausalLM"})},
              {"hidden_size", 256},
              {"intermediate_size", 512},
              {"num_hidden_layers", 2},
              {"num_attention_heads", 8},
              {"num_key_value_heads", 2},
              {"vocab_size", 1000},
              {"max_position_embeddings", 4096},
              {"rms_norm_eps", 1e-5},
              {"rope_theta", 500000.0},
              {"bos_token_id", 1},
              {"eos_token_id", 2},
              {"torch_dtype", "bfloat16"}};
}

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

TEST_CASE("ModelConfig parses a Llama config with llama3 rope scaling", "[model_config]") {
  TempModelDir dir;
  json j = BaseLlama();
  j["rope_scaling"] = {{"rope_type", "llama3"},
                       {"factor", 8.0},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192}};
  j["tie_word_embeddings"] = true;
  dir.WriteConfig(j);

  auto c = LoadModelConfig(dir.path());
  REQUIRE(c.ok());
  CHECK(c->architecture == Architecture::kLlama);
  CHECK(c->architecture_name == "LlamaForCausalLM");
  CHECK(c->hidden_size == 256);
  CHECK(c->intermediate_size == 512);
  CHECK(c->num_layers == 2);
  CHECK(c->num_q_heads == 8);
  CHECK(c->num_kv_heads == 2);
  CHECK(c->head_dim == 32);
  CHECK(c->q_size() == 256);
  CHECK(c->kv_size() == 64);
  CHECK(c->vocab_size == 1000);
  CHECK(c->max_position_embeddings == 4096);
  CHECK(c->rms_norm_eps == Approx(1e-5f));
  CHECK(c->rope_theta == Approx(500000.0f));
  CHECK(c->tie_word_embeddings);
  CHECK_FALSE(c->qkv_bias);
  CHECK_FALSE(c->sliding_window.has_value());
  CHECK(c->dtype == DType::kBF16);
  REQUIRE(c->bos_token_id.has_value());
  CHECK(*c->bos_token_id == 1);
  CHECK(c->eos_token_ids == std::vector<int32_t>{2});
  CHECK(c->rope_scaling.type == RopeScaling::Type::kLlama3);
  CHECK(c->rope_scaling.factor == Approx(8.0f));
  CHECK(c->rope_scaling.low_freq_factor == Approx(1.0f));
  CHECK(c->rope_scaling.high_freq_factor == Approx(4.0f));
  CHECK(c->rope_scaling.original_max_position_embeddings == 8192);
  CHECK(c->name == std::filesystem::path(dir.path()).filename().string());
  // A trailing slash does not lose the name.
  auto slash = LoadModelConfig(dir.path() + "/");
  REQUIRE(slash.ok());
  CHECK(slash->name == c->name);
}

TEST_CASE("ModelConfig rope_scaling variants", "[model_config]") {
  TempModelDir dir;
  json j = BaseLlama();
  SECTION("no rope_scaling") {
    dir.WriteConfig(j);
    auto c = LoadModelConfig(dir.path());
    REQUIRE(c.ok());
    CHECK(c->rope_scaling.type == RopeScaling::Type::kNone);
  }
  SECTION("legacy 'type' key, linear") {
    j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
    dir.WriteConfig(j);
    auto c = LoadModelConfig(dir.path());
    REQUIRE(c.ok());
    CHECK(c->rope_scaling.type == RopeScaling::Type::kLinear);
    CHECK(c->rope_scaling.factor == Approx(2.0f));
  }
  SECTION("unsupported type is Unimplemented naming it") {
    j["rope_scaling"] = {{"rope_type", "longrope"}, {"factor", 4.0}};
    dir.WriteConfig(j);
    auto c = LoadModelConfig(dir.path());
    REQUIRE_FALSE(c.ok());
    CHECK(c.status().code() == StatusCode::kUnimplemented);
    CHECK(Contains(c.status().message(), "longrope"));
  }
  SECTION("llama3 with high_freq_factor <= low_freq_factor") {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", 8.0},
                         {"low_freq_factor", 4.0},
                         {"high_freq_factor", 4.0},
                         {"original_max_position_embeddings", 8192}};
    dir.WriteConfig(j);
    auto c = LoadModelConfig(dir.path());
    REQUIRE_FALSE(c.ok());
    CHECK(Contains(c.status().message(), "high_freq_factor"));
  }
}

TEST_CASE("ModelConfig Qwen2 sets attention_bias, and its sliding window needs use_sliding_window",
          "[model_config]") {
  TempModelDir dir;
  json j = BaseLlama();
  j["architectures"] = json::array({"Qwen2ForCausalLM"});
  j["sliding_window"] = 4096;
  SECTION("use_sliding_window false") {
    j["use_sliding_window"] = false;
    dir.WriteConfig(j);
    auto c = LoadModelConfig(dir.path());
    REQUIRE(c.ok());
    CHECK(c->architecture == Architecture::kQwen2);
    CHECK(c->qkv_bias);
    CHECK_FALSE(c->sliding_window.has_value());
  }
  SECTION("use_sliding_window absent") {
    dir.WriteConfig(j);
    auto c = LoadModelConfig(dir.path());
    REQUIRE(c.ok());
    CHECK(c->qkv_bias);
    CHECK_FALSE(c->sliding_window.has_value());
  }
  SECTION("use_sliding_window true") {
    j["use_sliding_window"] = true;
    dir.WriteConfig(j);
    auto c = LoadModelConfig(dir.path());
    REQUIRE(c.ok());
    REQUIRE(c->sliding_window.has_value());
    CHECK(*c->sliding_window == 4096);
    // HF's max_window_layers defaults to 28: neither of the 2 layers uses the window.
    CHECK(c->WindowLeft(0) == -1);
    CHECK(c->WindowLeft(1) == -1);
    CHECK_FALSE(c->AnyLayerWindowed());
  }
}

// Per-layer rule of HF's Qwen2Config: with use_sliding_window, layer l uses the window when
// layer_types[l] == "sliding_attention" or, without layer_types, when l >= max_window_layers.
TEST_CASE("ModelConfig Qwen2 per-layer sliding window", "[model_config]") {
  TempModelDir dir;
  json j = BaseLlama();
  j["architectures"] = json::array({"Qwen2ForCausalLM"});
  j["num_hidden_layers"] = 4;
  j["use_sliding_window"] = true;
  j["sliding_window"] = 7;
  auto windows = [&]() {
    dir.WriteConfig(j);
    auto c = LoadModelConfig(dir.path());
    REQUIRE(c.ok());
    std::vector<int> w;
    for (int l = 0; l < c->num_layers; ++l) w.push_back(c->WindowLeft(l));
    return w;
  };
  SECTION("max_window_layers splits the stack") {
    j["max_window_layers"] = 1;
    CHECK(windows() == std::vector<int>{-1, 6, 6, 6});
    j["max_window_layers"] = 3;
    CHECK(windows() == std::vector<int>{-1, -1, -1, 6});
  }
  SECTION("max_window_layers 0: every layer; >= num layers: none") {
    j["max_window_layers"] = 0;
    CHECK(windows() == std::vector<int>{6, 6, 6, 6});
    j["max_window_layers"] = 4;
    CHECK(windows() == std::vector<int>{-1, -1, -1, -1});
  }
  SECTION("absent max_window_layers is 28") {
    j["num_hidden_layers"] = 30;
    const std::vector<int> w = windows();
    for (int l = 0; l < 30; ++l) CHECK(w[l] == (l >= 28 ? 6 : -1));
  }
  SECTION("layer_types wins over max_window_layers") {
    j["max_window_layers"] = 0;
    j["layer_types"] = {"full_attention", "sliding_attention", "full_attention",
                        "sliding_attention"};
    CHECK(windows() == std::vector<int>{-1, 6, -1, 6});
  }
  SECTION("without use_sliding_window no layer has a window") {
    j["use_sliding_window"] = false;
    j["max_window_layers"] = 0;
    j["layer_types"] = {"sliding_attention", "sliding_attention", "sliding_attention",
                        "sliding_attention"};
    CHECK(windows() == std::vector<int>{-1, -1, -1, -1});
  }
  SECTION("sliding_window null disables; absent means HF's default 4096") {
    j["max_window_layers"] = 2;
    j["sliding_window"] = nullptr;
    CHECK(windows() == std::vector<int>{-1, -1, -1, -1});
    j.erase("sliding_window");
    CHECK(windows() == std::vector<int>{-1, -1, 4095, 4095});
  }
  SECTION("bad fields are errors naming them") {
    const char* field = "";
    SECTION("layer_types of the wrong length") {
      j["layer_types"] = {"full_attention"};
      field = "layer_types";
    }
    SECTION("unknown layer type") {
      j["layer_types"] = {"full_attention", "chunked_attention", "full_attention",
                          "full_attention"};
      field = "chunked_attention";
    }
    SECTION("negative max_window_layers") {
      j["max_window_layers"] = -1;
      field = "max_window_layers";
    }
    SECTION("zero sliding_window") {
      j["sliding_window"] = 0;
      field = "sliding_window";
    }
    dir.WriteConfig(j);
    auto c = LoadModelConfig(dir.path());
    REQUIRE_FALSE(c.ok());
    CHECK(c.status().code() == StatusCode::kInvalidArgument);
    CHECK(Contains(c.status().message(), field));
  }
}

TEST_CASE("ModelConfig Mistral sliding window", "[model_config]") {
  TempModelDir dir;
  json j = BaseLlama();
  j["architectures"] = json::array({"MistralForCausalLM"});
  SECTION("set") {
    j["sliding_window"] = 4096;
    dir.WriteConfig(j);
    auto c = LoadModelConfig(dir.path());
    REQUIRE(c.ok());
    CHECK(c->architecture == Architecture::kMistral);
    CHECK_FALSE(c->qkv_bias);
    REQUIRE(c->sliding_window.has_value());
    CHECK(*c->sliding_window == 4096);
    // Every layer, window_left = W - 1 (query i sees keys j with i - j < W).
    CHECK(c->WindowLeft(0) == 4095);
    CHECK(c->WindowLeft(1) == 4095);
    CHECK(c->AnyLayerWindowed());
  }
  SECTION("layer_types and max_window_layers are Qwen2's, not Mistral's") {
    j["sliding_window"] = 5;
    j["max_window_layers"] = 1;
    j["layer_types"] = {"full_attention", "full_attention"};
    dir.WriteConfig(j);
    auto c = LoadModelConfig(dir.path());
    REQUIRE(c.ok());
    CHECK(c->WindowLeft(0) == 4);
    CHECK(c->WindowLeft(1) == 4);
  }
  SECTION("absent: HF's default 4096") {
    dir.WriteConfig(j);
    auto c = LoadModelConfig(dir.path());
    REQUIRE(c.ok());
    REQUIRE(c->sliding_window.has_value());
    CHECK(*c->sliding_window == 4096);
  }
  SECTION("null") {
    j["sliding_window"] = nullptr;
    dir.WriteConfig(j);
    auto c = LoadModelConfig(dir.path());
    REQUIRE(c.ok());
    CHECK_FALSE(c->sliding_window.has_value());
    CHECK(c->WindowLeft(0) == -1);
    CHECK(c->WindowLeft(1) == -1);
    CHECK_FALSE(c->AnyLayerWindowed());
  }
  SECTION("Llama has no sliding window, whatever the config says") {
    j["architectures"] = json::array({"LlamaForCausalLM"});
    j["sliding_window"] = 16;
    dir.WriteConfig(j);
    auto c = LoadModelConfig(dir.path());
    REQUIRE(c.ok());
    CHECK_FALSE(c->sliding_window.has_value());
    CHECK(c->WindowLeft(0) == -1);
  }
  SECTION("an explicit attention_bias is honored for Llama") {
    j["architectures"] = json::array({"LlamaForCausalLM"});
    j["attention_bias"] = true;
    dir.WriteConfig(j);
    auto c = LoadModelConfig(dir.path());
    REQUIRE(c.ok());
    CHECK(c->qkv_bias);
    CHECK(c->o_bias);  // HF LlamaAttention: all four projections
  }
}

TEST_CASE("ModelConfig unknown architecture is Unimplemented naming it", "[model_config]") {
  TempModelDir dir;
  json j = BaseLlama();
  j["architectures"] = json::array({"GPTNeoXForCausalLM"});
  dir.WriteConfig(j);
  auto c = LoadModelConfig(dir.path());
  REQUIRE_FALSE(c.ok());
  CHECK(c.status().code() == StatusCode::kUnimplemented);
  CHECK(Contains(c.status().message(), "GPTNeoXForCausalLM"));
}

TEST_CASE("ModelConfig missing or bad fields are errors naming them", "[model_config]") {
  TempModelDir dir;
  json j = BaseLlama();
  SECTION("missing hidden_size") {
    j.erase("hidden_size");
    dir.WriteConfig(j);
    auto c = LoadModelConfig(dir.path());
    REQUIRE_FALSE(c.ok());
    CHECK(c.status().code() == StatusCode::kInvalidArgument);
    CHECK(Contains(c.status().message(), "hidden_size"));
  }
  SECTION("missing vocab_size") {
    j.erase("vocab_size");
    dir.WriteConfig(j);
    auto c = LoadModelConfig(dir.path());
    REQUIRE_FALSE(c.ok());
    CHECK(Contains(c.status().message(), "vocab_size"));
  }
  SECTION("null num_hidden_layers") {
    j["num_hidden_layers"] = nullptr;
    dir.WriteConfig(j);
    auto c = LoadModelConfig(dir.path());
    REQUIRE_FALSE(c.ok());
    CHECK(Contains(c.status().message(), "num_hidden_layers"));
  }
  SECTION("non-positive intermediate_size") {
    j["intermediate_size"] = 0;
    dir.WriteConfig(j);
    auto c = LoadModelConfig(dir.path());
    REQUIRE_FALSE(c.ok());
    CHECK(Contains(c.status().message(), "intermediate_size"));
  }
  SECTION("string where an integer belongs") {
    j["num_attention_heads"] = "8";
    dir.WriteConfig(j);
    auto c = LoadModelConfig(dir.path());
    REQUIRE_FALSE(c.ok());
    CHECK(Contains(c.status().message(), "num_attention_heads"));
  }
  SECTION("heads not divisible by kv heads") {
    j["num_attention_heads"] = 8;
    j["num_key_value_heads"] = 3;
    dir.WriteConfig(j);
    auto c = LoadModelConfig(dir.path());
    REQUIRE_FALSE(c.ok());
    CHECK(c.status().code() == StatusCode::kInvalidArgument);
    CHECK(Contains(c.status().message(), "num_key_value_heads"));
    CHECK(Contains(c.status().message(), "(3)"));
  }
  SECTION("missing architectures") {
    j.erase("architectures");
    dir.WriteConfig(j);
    auto c = LoadModelConfig(dir.path());
    REQUIRE_FALSE(c.ok());
    CHECK(Contains(c.status().message(), "architectures"));
  }
  SECTION("eos outside the vocabulary") {
    j["eos_token_id"] = 1000;
    dir.WriteConfig(j);
    auto c = LoadModelConfig(dir.path());
    REQUIRE_FALSE(c.ok());
    CHECK(Contains(c.status().message(), "1000"));
  }
  SECTION("config.json that is not JSON") {
    dir.Write("config.json", "{ this is not json");
    auto c = LoadModelConfig(dir.path());
    REQUIRE_FALSE(c.ok());
    CHECK(Contains(c.status().message(), "config.json"));
  }
  SECTION("no config.json") {
    auto c = LoadModelConfig(dir.path());
    REQUIRE_FALSE(c.ok());
    CHECK(c.status().code() == StatusCode::kNotFound);
  }
}

TEST_CASE("ModelConfig head_dim defaults to hidden/heads and can be explicit", "[model_config]") {
  TempModelDir dir;
  json j = BaseLlama();
  j["hidden_size"] = 260;  // not a multiple of 8 heads
  SECTION("without head_dim it is an error") {
    dir.WriteConfig(j);
    auto c = LoadModelConfig(dir.path());
    REQUIRE_FALSE(c.ok());
    CHECK(c.status().code() == StatusCode::kInvalidArgument);
    CHECK(Contains(c.status().message(), "num_attention_heads"));
  }
  SECTION("an odd head_dim is an error") {
    j["hidden_size"] = 200;  // 8 heads of 25
    dir.WriteConfig(j);
    auto c = LoadModelConfig(dir.path());
    REQUIRE_FALSE(c.ok());
    CHECK(Contains(c.status().message(), "head_dim"));
  }
  SECTION("explicit head_dim is used") {
    j["head_dim"] = 64;
    dir.WriteConfig(j);
    auto c = LoadModelConfig(dir.path());
    REQUIRE(c.ok());
    CHECK(c->head_dim == 64);
    CHECK(c->q_size() == 512);
  }
  SECTION("num_key_value_heads defaults to num_attention_heads") {
    j["hidden_size"] = 256;
    j.erase("num_key_value_heads");
    dir.WriteConfig(j);
    auto c = LoadModelConfig(dir.path());
    REQUIRE(c.ok());
    CHECK(c->num_kv_heads == 8);
  }
}

TEST_CASE("ModelConfig generation_config.json eos list overrides config.json", "[model_config]") {
  TempModelDir dir;
  json j = BaseLlama();
  j["eos_token_id"] = 2;
  dir.WriteConfig(j);
  {
    auto c = LoadModelConfig(dir.path());
    REQUIRE(c.ok());
    CHECK(c->eos_token_ids == std::vector<int32_t>{2});
  }
  dir.Write("generation_config.json", R"({"bos_token_id": 5, "eos_token_id": [7, 8, 9]})");
  auto c = LoadModelConfig(dir.path());
  REQUIRE(c.ok());
  CHECK(c->eos_token_ids == std::vector<int32_t>{7, 8, 9});
  REQUIRE(c->bos_token_id.has_value());
  CHECK(*c->bos_token_id == 5);

  SECTION("a config.json eos list is read too") {
    fs::remove(fs::path(dir.path()) / "generation_config.json");
    j["eos_token_id"] = json::array({3, 4});
    dir.WriteConfig(j);
    auto c2 = LoadModelConfig(dir.path());
    REQUIRE(c2.ok());
    CHECK(c2->eos_token_ids == std::vector<int32_t>{3, 4});
  }
  SECTION("generation_config eos ids are range-checked") {
    dir.Write("generation_config.json", R"({"eos_token_id": [7, 5000]})");
    auto c2 = LoadModelConfig(dir.path());
    REQUIRE_FALSE(c2.ok());
    CHECK(Contains(c2.status().message(), "5000"));
  }
}

TEST_CASE("ModelConfig generation_config.json: null eos, sampling defaults, unknown keys",
          "[model_config]") {
  TempModelDir dir;
  json j = BaseLlama();
  j["eos_token_id"] = json::array({2, 3});
  dir.WriteConfig(j);
  SECTION("a null eos_token_id keeps config.json's list") {
    dir.Write("generation_config.json", R"({"eos_token_id": null, "bos_token_id": null})");
    auto c = LoadModelConfig(dir.path());
    REQUIRE(c.ok());
    CHECK(c->eos_token_ids == std::vector<int32_t>{2, 3});
    CHECK(c->bos_token_id == 1);
    CHECK(c->generation.empty());
  }
  SECTION("a single int replaces it") {
    dir.Write("generation_config.json", R"({"eos_token_id": 9})");
    auto c = LoadModelConfig(dir.path());
    REQUIRE(c.ok());
    CHECK(c->eos_token_ids == std::vector<int32_t>{9});
  }
  SECTION("sampling defaults are read and applied only where set") {
    dir.Write("generation_config.json",
              R"({"do_sample": true, "temperature": 0.6, "top_p": 0.9, "top_k": 20,
                  "min_p": 0.05, "repetition_penalty": 1.1, "max_new_tokens": 77,
                  "typical_p": 0.5, "transformers_version": "5.17.0"})");
    auto c = LoadModelConfig(dir.path());
    REQUIRE(c.ok());
    const GenerationDefaults& g = c->generation;
    CHECK(g.temperature == 0.6f);
    CHECK(g.top_p == 0.9f);
    CHECK(g.top_k == 20);
    CHECK(g.min_p == 0.05f);
    CHECK(g.repetition_penalty == 1.1f);
    CHECK(g.max_new_tokens == 77);
    // Not applied, and said so in the start-up table (vLLM ignores them too).
    CHECK(g.not_applied == std::vector<std::string>{"do_sample", "typical_p"});
    CHECK(Contains(g.Describe(), "temperature 0.6"));
    CHECK(Contains(g.Describe(), "not applied: do_sample typical_p"));
    SamplingParams sp;
    sp.presence_penalty = 0.5f;
    g.ApplyTo(&sp);
    CHECK(sp.temperature == 0.6f);
    CHECK(sp.top_k == 20);
    CHECK(sp.presence_penalty == 0.5f);
  }
  SECTION("a wrong type is an error naming the key") {
    dir.Write("generation_config.json", R"({"temperature": "hot"})");
    auto c = LoadModelConfig(dir.path());
    REQUIRE_FALSE(c.ok());
    CHECK(Contains(c.status().message(), "generation_config.json: field 'temperature'"));
  }
  SECTION("an eos list with a non-integer is an error") {
    dir.Write("generation_config.json", R"({"eos_token_id": [2, "x"]})");
    auto c = LoadModelConfig(dir.path());
    REQUIRE_FALSE(c.ok());
    CHECK(Contains(c.status().message(), "eos_token_id"));
  }
}

}  // namespace
}  // namespace llm
