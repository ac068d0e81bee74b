// LoadModelConfig for Mixtral, Qwen3-MoE, Gemma 2, Gemma 3 (text) and gpt-oss: the committed
// HF fixtures' config.json (transformers 5 layout) and config_v4.json (4.x layout) read to the
// same settings, and the keys that change the math and are not implemented are refused by name.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/architectures/decoder_spec.h"
#include "engine/loader/deepseek_config.h"
#include "engine/loader/model_config.h"
#include "tiny_checkpoint.h"

namespace llm {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string FixtureDir(const std::string& name) {
  return std::string(LLM_SOURCE_DIR) + "/tests/fixtures/models/" + name;
}

json ReadFixture(const std::string& name, const std::string& file) {
  std::ifstream in(FixtureDir(name) + "/" + file);
  return json::parse(in);
}

// Loads `j` as config.json of a fresh directory (with the fixture's generation_config.json).
StatusOr<ModelConfig> LoadConfigJson(const std::string& fixture, const json& j) {
  static int n = 0;
  test::TempDir dir("model_config_families_" + std::to_string(++n));
  std::ofstream(dir.path() / "config.json") << j.dump(2);
  const fs::path gen = fs::path(FixtureDir(fixture)) / "generation_config.json";
  if (fs::exists(gen)) fs::copy_file(gen, dir.path() / "generation_config.json");
  return LoadModelConfig(dir.path().string());
}

// Both layouts of a fixture; they must agree on every setting checked here.
std::pair<ModelConfig, ModelConfig> BothLayouts(const std::string& name) {
  auto v5 = LoadConfigJson(name, ReadFixture(name, "config.json"));
  auto v4 = LoadConfigJson(name, ReadFixture(name, "config_v4.json"));
  REQUIRE(v5.ok());
  REQUIRE(v4.ok());
  return {*v5, *v4};
}

void CheckSame(const ModelConfig& a, const ModelConfig& b) {
  CHECK(a.architecture == b.architecture);
  CHECK(a.rope_theta == b.rope_theta);
  CHECK(a.rope_scaling.type == b.rope_scaling.type);
  CHECK(a.rope_scaling.factor == b.rope_scaling.factor);
  CHECK(a.rope_scaling.attention_factor == b.rope_scaling.attention_factor);
  CHECK(a.sliding_layers_own_rope == b.sliding_layers_own_rope);
  CHECK(a.sliding_rope_theta == b.sliding_rope_theta);
  CHECK(a.sliding_rope_scaling.type == b.sliding_rope_scaling.type);
  CHECK(a.sliding_window == b.sliding_window);
  CHECK(a.window_layers == b.window_layers);
  CHECK(a.moe.num_experts == b.moe.num_experts);
  CHECK(a.moe.layers == b.moe.layers);
  CHECK(a.SoftmaxScale() == b.SoftmaxScale());
}

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

std::string Message(const StatusOr<ModelConfig>& c) {
  return c.ok() ? "" : c.status().message();
}

TEST_CASE("Mixtral config: experts, top-k, renormalized, no window", "[model_config_families]") {
  auto [c, v4] = BothLayouts("mixtral");
  CheckSame(c, v4);
  CHECK(c.architecture == Architecture::kMixtral);
  CHECK(c.moe.num_experts == 4);
  CHECK(c.moe.top_k == 2);
  CHECK(c.moe.intermediate == 128);
  CHECK(c.moe.normalize);
  CHECK(c.moe.layers == std::vector<bool>{true, true});
  CHECK(!c.sliding_window);
  CHECK(c.rope_theta == 1e6f);

  json j = ReadFixture("mixtral", "config.json");
  j["sliding_window"] = 32;
  auto w = LoadConfigJson("mixtral", j);
  REQUIRE(w.ok());
  CHECK(w->WindowLeft(0) == 31);
  CHECK(w->WindowLeft(1) == 31);
  j["num_experts_per_tok"] = 5;  // more than the 4 experts
  CHECK(Contains(Message(LoadConfigJson("mixtral", j)), "num_experts_per_tok"));
  j = ReadFixture("mixtral", "config.json");
  j.erase("num_local_experts");
  CHECK(Contains(Message(LoadConfigJson("mixtral", j)), "num_local_experts"));
}

TEST_CASE("Qwen3-MoE config: mlp_only_layers, decoder_sparse_step, norm_topk_prob",
          "[model_config_families]") {
  auto [c, v4] = BothLayouts("qwen3_moe");
  CheckSame(c, v4);
  CHECK(c.architecture == Architecture::kQwen3Moe);
  CHECK(c.qk_norm);
  CHECK(c.moe.num_experts == 8);
  CHECK(c.moe.top_k == 2);
  CHECK(c.moe.intermediate == 32);
  CHECK(c.intermediate_size == 128);
  CHECK(c.moe.normalize);
  CHECK(c.moe.layers == std::vector<bool>{false, true});  // layer 0 is in mlp_only_layers

  json j = ReadFixture("qwen3_moe", "config.json");
  j["num_hidden_layers"] = 4;
  j["mlp_only_layers"] = json::array();
  j["decoder_sparse_step"] = 2;
  j["norm_topk_prob"] = false;
  auto s = LoadConfigJson("qwen3_moe", j);
  REQUIRE(s.ok());
  CHECK(s->moe.layers == std::vector<bool>{false, true, false, true});
  CHECK(!s->moe.normalize);
  // 4.x spells the expert count num_experts; both present must agree.
  j.erase("num_local_experts");
  j["num_experts"] = 8;
  CHECK(LoadConfigJson("qwen3_moe", j).ok());
  j["num_local_experts"] = 6;
  CHECK(Contains(Message(LoadConfigJson("qwen3_moe", j)), "disagree"));

  j = ReadFixture("qwen3_moe", "config.json");
  j["use_sliding_window"] = true;  // with a null window: none
  CHECK(LoadConfigJson("qwen3_moe", j).ok());
  j["sliding_window"] = 4096;
  CHECK(Contains(Message(LoadConfigJson("qwen3_moe", j)), "use_sliding_window"));
  j["use_sliding_window"] = false;  // Qwen3MoeConfig then drops the window
  j["sliding_window"] = 4096;
  auto nw = LoadConfigJson("qwen3_moe", j);
  REQUIRE(nw.ok());
  CHECK(!nw->AnyLayerWindowed());
  j = ReadFixture("qwen3_moe", "config.json");
  j["mlp_only_layers"] = json::array({7});
  CHECK(Contains(Message(LoadConfigJson("qwen3_moe", j)), "mlp_only_layers"));
}

TEST_CASE("Gemma 2 config: scale, soft-caps, GELU-tanh, alternating windows",
          "[model_config_families]") {
  auto [c, v4] = BothLayouts("gemma2");
  CheckSame(c, v4);
  CHECK(c.architecture == Architecture::kGemma2);
  CHECK(c.hidden_act == HiddenAct::kGeluTanh);
  CHECK(c.attn_logit_softcap == 50.0f);
  CHECK(c.final_logit_softcap == 30.0f);
  CHECK(c.SoftmaxScale() == 1.0f / std::sqrt(16.0f));
  CHECK(c.WindowLeft(0) == 15);
  CHECK(c.WindowLeft(1) == -1);
  CHECK(c.tie_word_embeddings);

  json j = ReadFixture("gemma2", "config.json");
  j["query_pre_attn_scalar"] = 144;
  j.erase("layer_types");  // Gemma2Config's rule: even layers slide
  j["num_hidden_layers"] = 3;
  j.erase("final_logit_softcapping");  // absent: the class default, 30
  auto g = LoadConfigJson("gemma2", j);
  REQUIRE(g.ok());
  CHECK(g->SoftmaxScale() == 1.0f / 12.0f);
  CHECK(g->window_layers == std::vector<bool>{true, false, true});
  CHECK(g->final_logit_softcap == 30.0f);
  j["final_logit_softcapping"] = nullptr;  // null: no cap
  CHECK(LoadConfigJson("gemma2", j)->final_logit_softcap == 0.0f);

  j = ReadFixture("gemma2", "config.json");
  j["hidden_activation"] = "gelu";
  CHECK(Contains(Message(LoadConfigJson("gemma2", j)), "hidden_activation"));
  j = ReadFixture("gemma2", "config.json");
  j.erase("query_pre_attn_scalar");
  CHECK(Contains(Message(LoadConfigJson("gemma2", j)), "query_pre_attn_scalar"));
  j = ReadFixture("gemma2", "config.json");
  j.erase("head_dim");
  CHECK(Contains(Message(LoadConfigJson("gemma2", j)), "head_dim"));
  j = ReadFixture("gemma2", "config.json");
  j["sliding_window"] = nullptr;
  CHECK(Contains(Message(LoadConfigJson("gemma2", j)), "sliding_window"));
}

TEST_CASE("Gemma 3 config: per-layer-type rope, q/k norm, sliding_window_pattern",
          "[model_config_families]") {
  auto [c, v4] = BothLayouts("gemma3");
  CheckSame(c, v4);
  CHECK(c.architecture == Architecture::kGemma3);
  CHECK(c.qk_norm);
  CHECK(c.attn_logit_softcap == 0.0f);
  CHECK(c.final_logit_softcap == 0.0f);
  CHECK(c.window_layers == std::vector<bool>{true, false, true});
  // Full layers: theta 1e6 with linear scaling 8; sliding layers: theta 1e4, no scaling.
  CHECK(c.LayerRopeTheta(1) == 1e6f);
  CHECK(c.LayerRopeScaling(1).type == RopeScaling::Type::kLinear);
  CHECK(c.LayerRopeScaling(1).factor == 8.0f);
  CHECK(c.LayerRopeTheta(0) == 1e4f);
  CHECK(c.LayerRopeScaling(0).type == RopeScaling::Type::kNone);

  json j = ReadFixture("gemma3", "config_v4.json");
  j.erase("layer_types");
  j["num_hidden_layers"] = 7;
  j["sliding_window_pattern"] = 3;
  j["rope_local_base_freq"] = 5000.0;
  auto p = LoadConfigJson("gemma3", j);
  REQUIRE(p.ok());
  CHECK(p->window_layers == std::vector<bool>{true, true, false, true, true, false, true});
  CHECK(p->LayerRopeTheta(0) == 5000.0f);

  j = ReadFixture("gemma3", "config.json");
  j["rope_local_base_freq"] = 5000.0;  // disagrees with rope_parameters.sliding_attention
  CHECK(Contains(Message(LoadConfigJson("gemma3", j)), "rope_local_base_freq"));
  j = ReadFixture("gemma3", "config.json");
  j["rope_parameters"].erase("sliding_attention");
  CHECK(Contains(Message(LoadConfigJson("gemma3", j)), "sliding_attention"));
  j = ReadFixture("gemma3", "config.json");
  j["use_bidirectional_attention"] = true;
  CHECK(Contains(Message(LoadConfigJson("gemma3", j)), "use_bidirectional_attention"));
  j = ReadFixture("gemma3", "config.json");
  j["attn_logit_softcapping"] = 20.0;
  CHECK(LoadConfigJson("gemma3", j)->attn_logit_softcap == 20.0f);

  // The multimodal wrapper stays refused by name.
  j = ReadFixture("gemma3", "config.json");
  json wrapper = {{"architectures", json::array({"Gemma3ForConditionalGeneration"})},
                  {"text_config", j}};
  const std::string m = Message(LoadConfigJson("gemma3", wrapper));
  CHECK(Contains(m, "Gemma3ForConditionalGeneration"));
}

TEST_CASE("gpt-oss config: yarn, sinks, windows, experts, mxfp4", "[model_config_families]") {
  auto [c, v4] = BothLayouts("gpt_oss");
  CheckSame(c, v4);
  CHECK(c.architecture == Architecture::kGptOss);
  CHECK(c.attention_sinks);
  CHECK(c.qkv_bias);
  CHECK(c.o_bias);
  CHECK(c.moe.num_experts == 4);
  CHECK(c.moe.top_k == 2);
  CHECK(c.moe.swiglu_limit == 7.0f);
  CHECK(c.rope_scaling.type == RopeScaling::Type::kYarn);
  CHECK(!c.rope_scaling.truncate);
  CHECK(c.rope_scaling.attention_factor == Approx(0.1 * std::log(32.0) + 1.0));
  CHECK(c.WindowLeft(0) == 15);
  CHECK(c.WindowLeft(1) == -1);

  json j = ReadFixture("gpt_oss", "config.json");
  j["quantization_config"] = {
      {"quant_method", "mxfp4"},
      {"modules_to_not_convert", json::array({"model.layers.*.self_attn"})}};
  auto q = LoadConfigJson("gpt_oss", j);
  REQUIRE(q.ok());
  CHECK(q->quantization.method == WeightQuantization::Method::kMxfp4);
  // mxfp4 on another architecture is refused by name.
  json m = ReadFixture("mixtral", "config.json");
  m["quantization_config"] = {{"quant_method", "mxfp4"}};
  CHECK(Contains(Message(LoadConfigJson("mixtral", m)), "quantization method mxfp4"));
  j = ReadFixture("gpt_oss", "config.json");
  j["swiglu_limit"] = nullptr;  // null keeps the class default
  CHECK(LoadConfigJson("gpt_oss", j)->moe.swiglu_limit == 7.0f);
  j["swiglu_limit"] = "seven";
  CHECK(Contains(Message(LoadConfigJson("gpt_oss", j)), "swiglu_limit"));
}

}  // namespace
}  // namespace llm

namespace llm {
namespace {

// The dummy-weight benchmark configs (configs/models/NAME/config.json, the real models' shapes)
// load as the architecture they name, with the layer definition the CPU decoder computes.
TEST_CASE("The shipped benchmark configs load with their real shapes", "[model_config]") {
  const fs::path root = fs::path(LLM_SOURCE_DIR) / "configs" / "models";
  int n = 0;
  for (const auto& entry : fs::directory_iterator(root)) {
    const std::string dir = entry.path().string();
    INFO(dir);
    ++n;
    if (IsDeepseekModelDir(dir)) {  // MLA + MoE: DeepSeek's own config
      auto d = LoadDeepseekConfig(dir);
      INFO((d.ok() ? std::string() : d.status().message()));
      CHECK(d.ok());
    } else {
      auto config = LoadModelConfig(dir);
      INFO((config.ok() ? std::string() : config.status().message()));
      REQUIRE(config.ok());
      CHECK(config->num_layers > 0);
      auto spec = MakeDecoderSpec(*config);
      INFO((spec.ok() ? std::string() : spec.status().message()));
      CHECK(spec.ok());
    }
  }
  CHECK(n >= 5);
}

}  // namespace
}  // namespace llm
