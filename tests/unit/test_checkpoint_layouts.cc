// The transformers 4 key layout (top-level rope_theta / rope_scaling) and the transformers 5
// layout (rope_parameters, flat or per layer type) of the same weights give bit-identical logits,
// and the rope settings they carry do change the logits (so a reader that dropped them fails).
#include <catch2/catch.hpp>

#include <cstring>

#include "engine/loader/model_config.h"
#include "tests/gpu/engine_generate.h"
#include "tests/unit/tiny_checkpoint.h"

namespace llm {
namespace {

using json = nlohmann::json;
using test::TempDir;
using test::TinyCheckpoint;

gpu_test::Logits RunLogits(const std::filesystem::path& dir) {
  gpu_test::Logits logits;
  std::vector<int32_t> prompt;
  for (int i = 0; i < 24; ++i) prompt.push_back((i * 7 + 3) % 64);
  gpu_test::Generate(dir.string(), {prompt},
                     {.device = "cpu",
                      .block_size = 16,
                      .num_kv_blocks = 16,
                      .max_batched_tokens = 64,
                      .steps = 6,
                      .logits = &logits});
  return logits;
}

bool BitIdentical(const gpu_test::Logits& a, const gpu_test::Logits& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [id, steps] : a) {
    auto it = b.find(id);
    if (it == b.end() || it->second.size() != steps.size()) return false;
    for (size_t s = 0; s < steps.size(); ++s) {
      const auto& x = steps[s];
      const auto& y = it->second[s];
      if (x.size() != y.size() || std::memcmp(x.data(), y.data(), x.size() * 4) != 0) return false;
    }
  }
  return true;
}

struct LayoutCase {
  const char* name;
  TinyCheckpoint (*make)();
  json v4;  // keys merged into config.json for the 4.x layout
  json v5;  // ... for the 5.x layout
};

TEST_CASE("transformers 4 and 5 rope layouts give bit-identical logits", "[checkpoint_layout]") {
  const json llama3 = {{"factor", 8.0},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 64}};
  json llama3_v4 = llama3, llama3_v5 = llama3;
  llama3_v4["rope_type"] = "llama3";
  llama3_v5["rope_type"] = "llama3";
  llama3_v5["rope_theta"] = 500000.0;
  const json yarn = {{"factor", 4.0}, {"original_max_position_embeddings", 16}};
  json yarn_v4 = yarn, yarn_v5 = yarn;
  yarn_v4["type"] = "yarn";  // the pre-4.45 spelling
  yarn_v5["rope_type"] = "yarn";
  yarn_v5["rope_theta"] = 10000.0;
  const json ds_yarn = {{"factor", 4.0},   {"original_max_position_embeddings", 16},
                        {"beta_fast", 32}, {"beta_slow", 1},
                        {"mscale", 0.707}, {"mscale_all_dim", 0.707}};
  json ds_v4 = ds_yarn, ds_v5 = ds_yarn;
  ds_v4["type"] = "yarn";
  ds_v5["rope_type"] = "yarn";
  ds_v5["rope_theta"] = 10000.0;
  const json theta6_v5 = {{"rope_type", "default"}, {"rope_theta", 1000000.0}};

  const std::vector<LayoutCase> cases = {
      {"llama llama3",
       [] { return test::TinyLlama("llama"); },
       {{"rope_theta", 500000.0}, {"rope_scaling", llama3_v4}},
       {{"rope_parameters", llama3_v5}}},
      {"llama llama3 per layer type",
       [] { return test::TinyLlama("llama"); },
       {{"rope_theta", 500000.0}, {"rope_scaling", llama3_v4}},
       {{"rope_parameters", {{"full_attention", llama3_v5}}}}},
      {"llama yarn",
       [] { return test::TinyLlama("llama"); },
       {{"rope_theta", 10000.0}, {"rope_scaling", yarn_v4}},
       {{"rope_parameters", yarn_v5}}},
      {"qwen2 theta 1e6",
       [] { return test::TinyLlama("qwen2"); },
       {{"rope_theta", 1000000.0}},
       {{"rope_parameters", theta6_v5}}},
      {"mistral theta 1e6",
       [] { return test::TinyLlama("mistral"); },
       {{"rope_theta", 1000000.0}, {"sliding_window", nullptr}},
       {{"rope_parameters", theta6_v5}, {"sliding_window", nullptr}}},
      {"deepseek_v2 yarn",
       [] { return test::TinyDeepseekV2(); },
       {{"rope_theta", 10000.0}, {"rope_scaling", ds_v4}},
       {{"rope_parameters", ds_v5}}},
  };
  for (const LayoutCase& c : cases) {
    INFO(c.name);
    TempDir tmp("ckpt_layout");
    TinyCheckpoint base = c.make();
    TinyCheckpoint v4 = base, v5 = base;
    v4.config.update(c.v4);
    v5.config.update(c.v5);
    base.Write(tmp.path() / "plain");
    v4.Write(tmp.path() / "v4");
    v5.Write(tmp.path() / "v5");
    const auto l4 = RunLogits(tmp.path() / "v4");
    const auto l5 = RunLogits(tmp.path() / "v5");
    const auto plain = RunLogits(tmp.path() / "plain");
    REQUIRE(l4.size() == 1);
    REQUIRE(l4.at("0").size() == 6);
    CHECK(BitIdentical(l4, l5));
    // theta 10000 and no scaling: what a reader that drops the keys would run.
    CHECK_FALSE(BitIdentical(l5, plain));
  }
}

TEST_CASE("rope_scaling and rope_parameters: agreement, per-layer-type and errors",
          "[checkpoint_layout]") {
  TempDir tmp("ckpt_rope");
  TinyCheckpoint c = test::TinyLlama("llama");
  auto load = [&](const json& extra) {
    TinyCheckpoint x = c;
    x.config.update(extra);
    x.Write(tmp.path());
    return LoadModelConfig(tmp.path().string());
  };
  SECTION("v5 theta and llama3 reach the config") {
    auto m = load({{"rope_parameters",
                    {{"rope_type", "llama3"},
                     {"rope_theta", 500000.0},
                     {"factor", 8.0},
                     {"low_freq_factor", 1.0},
                     {"high_freq_factor", 4.0},
                     {"original_max_position_embeddings", 8192}}}});
    REQUIRE(m.ok());
    CHECK(m->rope_theta == 500000.0f);
    CHECK(m->rope_scaling.type == RopeScaling::Type::kLlama3);
    CHECK(m->rope_scaling.factor == 8.0f);
    CHECK(m->rope_scaling.original_max_position_embeddings == 8192);
  }
  SECTION("yarn attention factor scales the softmax") {
    auto m = load({{"rope_parameters", {{"rope_type", "yarn"}, {"factor", 4.0}}}});
    REQUIRE(m.ok());
    const float mscale = 0.1f * std::log(4.0f) + 1.0f;
    CHECK(m->rope_scaling.attention_factor == Approx(mscale));
    CHECK(m->SoftmaxScale() == Approx(mscale * mscale / std::sqrt(8.0f)));
    CHECK(m->rope_scaling.original_max_position_embeddings == 256);  // max_position_embeddings
  }
  SECTION("layer types with different settings are refused") {
    auto m = load({{"rope_parameters",
                    {{"full_attention", {{"rope_type", "default"}, {"rope_theta", 1e6}}},
                     {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 1e4}}}}}});
    REQUIRE_FALSE(m.ok());
    CHECK_THAT(m.status().message(), Catch::Contains("different rope settings"));
  }
  SECTION("rope_scaling alongside rope_parameters must agree") {
    auto m = load({{"rope_parameters", {{"rope_type", "linear"}, {"factor", 2.0}}},
                   {"rope_scaling", {{"rope_type", "linear"}, {"factor", 4.0}}}});
    REQUIRE_FALSE(m.ok());
    CHECK_THAT(m.status().message(), Catch::Contains("disagree"));
  }
  SECTION("a key the rope type does not use is refused by name") {
    auto m = load({{"rope_parameters", {{"rope_type", "linear"}, {"factor", 2.0}, {"beta", 1}}}});
    REQUIRE_FALSE(m.ok());
    CHECK_THAT(m.status().message(), Catch::Contains("'beta'"));
  }
  SECTION("dynamic and longrope are refused by name") {
    for (const char* t : {"dynamic", "longrope"}) {
      auto m = load({{"rope_parameters", {{"rope_type", t}, {"factor", 2.0}}}});
      REQUIRE_FALSE(m.ok());
      CHECK(m.status().code() == StatusCode::kUnimplemented);
      CHECK_THAT(m.status().message(), Catch::Contains(t));
    }
  }
}

}  // namespace
}  // namespace llm
