// Randomized fuzzing of the two places arbitrary client bytes reach: request conversion +
// validation (random protobuf wire bytes and random field values), and the tokenizer (random
// byte strings, random token ids). Nothing may crash; accepted requests must satisfy every limit.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "engine/engine_core.h"
#include "server/generation_service.h"
#include "text/tokenizer/bpe_trainer.h"
#include "text/tokenizer/tokenizer.h"

namespace llm {
namespace {

namespace pb = ::llm::v1;

std::string RandomBytes(std::mt19937_64& rng, size_t max_len) {
  std::string s(rng() % (max_len + 1), '\0');
  for (char& c : s) c = static_cast<char>(rng() & 0xff);
  return s;
}

float RandomFloat(std::mt19937_64& rng) {
  switch (rng() % 6) {
    case 0:
      return NAN;
    case 1:
      return INFINITY;
    case 2:
      return -1.0f;
    case 3:
      return 0.0f;
    default:
      return std::uniform_real_distribution<float>(-3.0f, 3.0f)(rng);
  }
}

TEST_CASE("fuzz: request conversion and validation never crash and enforce limits", "[fuzz]") {
  EngineConfig cfg;
  cfg.model.model_dir = "synthetic:vocab=500,max_len=256";
  cfg.model.block_size = 16;
  cfg.model.num_kv_blocks = 64;
  cfg.max_tokens_limit = 128;
  auto core = EngineCore::Create(cfg);
  REQUIRE(core.ok());
  ServerConfig sc;
  sc.max_prompt_bytes = 4096;
  std::mt19937_64 rng(7);
  int accepted = 0, rejected = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    pb::GenerateRequest req;
    if (iter % 2 == 0) {
      // Arbitrary wire bytes: most fail to parse, the rest yield odd field combinations.
      if (!req.ParseFromString(RandomBytes(rng, 64))) continue;
    } else {
      if (rng() % 4) {
        auto* ids = req.mutable_token_ids();
        const int n = static_cast<int>(rng() % 300);
        for (int i = 0; i < n; ++i) ids->add_ids(static_cast<int32_t>(rng() % 500));
        if (n > 0 && rng() % 5 == 0)
          ids->set_ids(rng() % n, rng() % 2 ? -1 - rng() % 9 : 500 + rng() % 9);
      } else {
        req.set_text(RandomBytes(rng, 32));
      }
      auto* s = req.mutable_sampling();
      if (rng() % 4 == 0) s->set_temperature(RandomFloat(rng));
      if (rng() % 4 == 0) s->set_top_p(RandomFloat(rng));
      if (rng() % 4 == 0) s->set_top_k(static_cast<int32_t>(rng() % 100) - 10);
      if (rng() % 4 == 0) s->set_min_p(RandomFloat(rng));
      if (rng() % 3 == 0) s->set_repetition_penalty(RandomFloat(rng));
      auto* t = req.mutable_stopping();
      if (rng() % 2) t->set_max_tokens(static_cast<int32_t>(rng() % 300) - 20);
      if (rng() % 3 == 0) t->set_min_tokens(static_cast<int32_t>(rng() % 50) - 5);
      if (rng() % 4 == 0) t->add_stop(RandomBytes(rng, 8));
      if (rng() % 4 == 0) t->add_stop_token_ids(static_cast<int32_t>(rng() % 600) - 50);
      if (rng() % 4 == 0) req.set_logprobs(static_cast<int32_t>(rng() % 40) - 5);
    }
    GenerationRequest g;
    Status st = ConvertRequest(req, **core, sc, &g);
    if (st.ok()) st = (*core)->Validate(&g);
    if (!st.ok()) {
      ++rejected;
      CHECK(!st.message().empty());
      continue;
    }
    ++accepted;
    // Whatever passed must respect every limit the engine relies on.
    REQUIRE(!g.prompt_ids.empty());
    REQUIRE(static_cast<int>(g.prompt_ids.size()) < (*core)->max_model_len());
    for (int32_t id : g.prompt_ids) REQUIRE((id >= 0 && id < 500));
    REQUIRE((g.stopping.max_tokens >= 1 && g.stopping.max_tokens <= 128));
    REQUIRE(std::isfinite(g.sampling.temperature));
    REQUIRE(g.sampling.temperature >= 0);
    REQUIRE((g.sampling.top_p > 0 && g.sampling.top_p <= 1));
    REQUIRE((g.sampling.min_p >= 0 && g.sampling.min_p <= 1));
    REQUIRE(g.sampling.repetition_penalty > 0);
  }
  CHECK(accepted > 100);
  CHECK(rejected > 100);
}

TEST_CASE("fuzz: tokenizer encodes and decodes arbitrary bytes", "[fuzz]") {
  BpeTrainerConfig tc;
  tc.vocab_size = 300;
  const std::string corpus = "the quick brown fox jumps over the lazy dog 1234 café 東京 🙂\n";
  auto tok = Tokenizer::FromJson(TrainByteLevelBpe(corpus + corpus, tc));
  REQUIRE(tok.ok());
  std::mt19937_64 rng(11);
  for (int iter = 0; iter < 3000; ++iter) {
    const std::string text = RandomBytes(rng, 64);
    const std::vector<int32_t> ids = (*tok)->Encode(text, rng() % 2);
    for (int32_t id : ids) REQUIRE((id >= 0 && id < (*tok)->vocab_size()));
    const std::string back = (*tok)->Decode(ids, /*skip_special_tokens=*/true);
    // Valid UTF-8 input round-trips exactly; anything else must still decode without crashing.
    std::vector<int32_t> random_ids(rng() % 20);
    for (auto& id : random_ids) id = static_cast<int32_t>(rng() % 400) - 50;
    (void)(*tok)->Decode(random_ids, rng() % 2);
    IncrementalDecoder dec(**tok, true);
    std::string streamed;
    for (int32_t id : ids) streamed += dec.Step(id);
    streamed += dec.Flush();
    REQUIRE(streamed == back);
  }
}

}  // namespace
}  // namespace llm
