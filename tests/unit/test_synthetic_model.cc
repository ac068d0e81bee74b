// The synthetic model's options: the controllable pace that serving tests use to keep a request
// running (step_delay_ms), and refusal of options it does not implement.
#include <catch2/catch.hpp>

#include <chrono>

#include "engine/runtime/model.h"

namespace llm {
namespace {

ForwardBatch OneToken() {
  ForwardBatch b;
  b.token_ids = {3};
  b.positions = {0};
  b.logit_rows = {0};
  return b;
}

TEST_CASE("synthetic model: step_delay_ms makes every forward take at least that long",
          "[synthetic]") {
  ModelLoadOptions opt;
  opt.model_dir = "synthetic:vocab=50,max_len=64,step_delay_ms=30";
  auto model = LoadModel(opt);
  REQUIRE(model.ok());
  std::vector<float> logits;
  // sleep_for never returns early, so this lower bound holds on any machine.
  for (int i = 0; i < 2; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    REQUIRE((*model)->Forward(OneToken(), &logits).ok());
    CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(30));
  }
  CHECK(logits.size() == 50);
}

TEST_CASE("synthetic model: unknown options and missing values are refused by name",
          "[synthetic]") {
  for (const char* dir : {"synthetic:step_delay=5", "synthetic:step_delay_ms=0",
                          "synthetic:step_delay_ms", "synthetic:vocab=-3"}) {
    ModelLoadOptions opt;
    opt.model_dir = dir;
    auto model = LoadModel(opt);
    REQUIRE_FALSE(model.ok());
    const std::string name = std::string(dir).substr(10);
    INFO(model.status().message());
    CHECK(model.status().message().find(name.substr(0, name.find('='))) != std::string::npos);
  }
}

}  // namespace
}  // namespace llm
