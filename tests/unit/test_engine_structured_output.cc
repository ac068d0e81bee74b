// Structured outputs on the host path: an EngineCore over the random-weight tiny model
// (build/cpu/models/tiny-llama, byte-level BPE) with JSON Schema, regex and choice constraints.
// From random weights only the grammar's mask can make the output match and end with "stop".
#include <catch2/catch.hpp>

#include <cmath>
#include <deque>
#include <latch>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "device_sampling_model.h"
#include "engine/engine_core.h"
#include "engine/grammar_cache.h"
#include "engine/sampling/sampler.h"
#include "engine/sampling/token_mask.h"

namespace llm {
namespace {

using test::DeviceSamplingModel;

struct TextSink : ResultSink {
  std::vector<int32_t> tokens;
  std::vector<SampledToken> logprobs;
  std::string text;
  int finals = 0;
  FinishReason reason = FinishReason::kNone;
  Status error;
  void OnOutput(GenerationOutput o) override {
    tokens.insert(tokens.end(), o.token_ids.begin(), o.token_ids.end());
    logprobs.insert(logprobs.end(), o.logprobs.begin(), o.logprobs.end());
    text += o.text;
    if (o.finished || !o.error.ok()) {
      ++finals;
      reason = o.finish_reason;
      error = o.error;
    }
  }
};

std::unique_ptr<EngineCore> MakeCore() {
  EngineConfig cfg;
  cfg.model.model_dir = LLM_TINY_MODEL_DIR;
  cfg.model.num_kv_blocks = 256;
  cfg.scheduler.max_num_seqs = 8;
  auto core = EngineCore::Create(cfg);
  REQUIRE(core.ok());
  REQUIRE(core.value()->grammar_cache() != nullptr);
  return std::move(core.value());
}

GenerationRequest MakeRequest(const EngineCore& core, const std::string& id, uint64_t seed,
                              Constraint c = {}) {
  GenerationRequest r;
  r.request_id = id;
  r.prompt_ids = core.tokenizer()->Encode("Answer in JSON: who are you?", true);
  r.sampling.temperature = 1.0f;
  r.sampling.seed = seed;
  r.stopping.max_tokens = 400;
  r.constraint = std::move(c);
  return r;
}

// Runs the requests together to the end; each must end exactly once.
std::map<std::string, std::shared_ptr<TextSink>> Run(EngineCore& core,
                                                     std::vector<GenerationRequest> reqs) {
  std::map<std::string, std::shared_ptr<TextSink>> sinks;
  for (GenerationRequest& r : reqs) {
    const Status st = core.Validate(&r);
    INFO(st.ToString());
    REQUIRE(st.ok());
    auto sink = std::make_shared<TextSink>();
    sinks[r.request_id] = sink;
    core.Add(std::move(r), sink);
  }
  int steps = 0;
  while (core.HasWork() && steps++ < 5000) core.Step();
  REQUIRE(!core.HasWork());
  for (const auto& [id, s] : sinks) {
    INFO(id);
    REQUIRE(s->finals == 1);
    REQUIRE(s->error.ok());
  }
  return sinks;
}

size_t CodePoints(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

const char* kSchema = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 8},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}
  },
  "required": ["name", "age"],
  "additionalProperties": false
})";

// The schema above, checked by hand.
void CheckMatchesSchema(const std::string& text) {
  INFO(text);
  const nlohmann::json v = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  REQUIRE(!v.is_discarded());
  REQUIRE(v.is_object());
  REQUIRE(v.contains("name"));
  REQUIRE(v.contains("age"));
  for (const auto& [k, x] : v.items()) CHECK((k == "name" || k == "age" || k == "tags"));
  REQUIRE(v["name"].is_string());
  CHECK(CodePoints(v["name"].get<std::string>()) <= 8);
  REQUIRE(v["age"].is_number_integer());
  CHECK(v["age"].get<int64_t>() >= 0);
  CHECK(v["age"].get<int64_t>() <= 120);
  if (v.contains("tags")) {
    REQUIRE(v["tags"].is_array());
    CHECK(v["tags"].size() <= 3);
    for (const auto& t : v["tags"]) CHECK((t == "a" || t == "b"));
  }
}

TEST_CASE("a JSON-schema constraint makes a random model emit matching JSON and stop",
          "[structured]") {
  auto core = MakeCore();
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 4; ++i) {
    reqs.push_back(MakeRequest(*core, "j" + std::to_string(i), 100 + i,
                               {Constraint::Kind::kJsonSchema, kSchema, {}}));
  }
  reqs[1].sampling.temperature = 0.0f;  // greedy
  reqs[2].sampling.logprobs = 2;        // host sampling with logprobs of the masked distribution
  reqs[3].sampling.repetition_penalty = 1.3f;
  for (const auto& [id, s] : Run(*core, std::move(reqs))) {
    INFO(id);
    CHECK(s->reason == FinishReason::kStop);
    CHECK(s->tokens.back() == 769);  // EOS
    CheckMatchesSchema(s->text);
  }
  CHECK(core->grammar_cache()->size() == 1);  // one schema, compiled once
}

TEST_CASE("json_object, regex and choice constraints", "[structured]") {
  auto core = MakeCore();
  std::vector<GenerationRequest> reqs;
  reqs.push_back(MakeRequest(*core, "obj", 1, {Constraint::Kind::kJsonObject, "", {}}));
  reqs.push_back(
      MakeRequest(*core, "re", 2, {Constraint::Kind::kRegex, "[a-c]{3}-[0-9]{2,4}", {}}));
  reqs.push_back(
      MakeRequest(*core, "choice", 3, {Constraint::Kind::kChoice, "", {"yes", "no", "maybe"}}));
  reqs.back().sampling.logprobs = 20;
  reqs.push_back(MakeRequest(*core, "gbnf", 4,
                             {Constraint::Kind::kGrammar, "root ::= \"x\" [0-9]+ \";\"", {}}));
  auto sinks = Run(*core, std::move(reqs));
  for (const auto& [id, s] : sinks) {
    INFO(id << ": " << s->text);
    CHECK(s->reason == FinishReason::kStop);
  }
  const auto obj = nlohmann::json::parse(sinks["obj"]->text, nullptr, false);
  CHECK(obj.is_object());
  CHECK(std::regex_match(sinks["re"]->text, std::regex("[a-c]{3}-[0-9]{2,4}")));
  const std::string& c = sinks["choice"]->text;
  CHECK((c == "yes" || c == "no" || c == "maybe"));
  // Logprobs are those of the masked distribution: the few allowed tokens hold all the mass,
  // which from random weights over 770 tokens the unmasked top 20 never would.
  const auto& lp = sinks["choice"]->logprobs;
  REQUIRE(!lp.empty());
  double mass = 0;
  for (const auto& [id, logprob] : lp[0].top) mass += std::exp(logprob);
  CHECK(mass == Approx(1.0).epsilon(1e-4));
  CHECK(std::regex_match(sinks["gbnf"]->text, std::regex("x[0-9]+;")));
}

TEST_CASE("a mixed batch leaves free requests' tokens unchanged", "[structured]") {
  auto core = MakeCore();
  auto free_alone = Run(*core, {MakeRequest(*core, "free", 7)});
  auto constrained_alone =
      Run(*core, {MakeRequest(*core, "c", 8, {Constraint::Kind::kJsonSchema, kSchema, {}})});
  std::vector<GenerationRequest> mixed;
  mixed.push_back(MakeRequest(*core, "free", 7));
  mixed.push_back(MakeRequest(*core, "c", 8, {Constraint::Kind::kJsonSchema, kSchema, {}}));
  mixed.push_back(MakeRequest(*core, "c2", 9, {Constraint::Kind::kRegex, "[0-9]{5}", {}}));
  auto together = Run(*core, std::move(mixed));
  CHECK(together["free"]->tokens == free_alone["free"]->tokens);
  CHECK(together["c"]->tokens == constrained_alone["c"]->tokens);
  CheckMatchesSchema(together["c"]->text);
}

// Runs the same requests through the host path and through DeviceSamplingModel (overlapping steps
// or not), and checks the tokens agree. `logprobs_row`: one constrained request also asks for
// logprobs, so its steps sample on the host and do not overlap until it ends.
void CheckDevicePathMatchesHost(bool overlap, int threads, bool logprobs_row) {
  EngineConfig cfg;
  cfg.model.model_dir = LLM_TINY_MODEL_DIR;
  cfg.model.num_kv_blocks = 256;
  cfg.scheduler.max_num_seqs = 8;
  cfg.structured_output_threads = threads;
  auto inner = LoadModel(cfg.model);
  REQUIRE(inner.ok());
  auto owned = std::make_unique<DeviceSamplingModel>(std::move(inner).value(), overlap);
  DeviceSamplingModel* device = owned.get();
  auto made = EngineCore::Create(cfg, std::move(owned));
  REQUIRE(made.ok());
  EngineCore& dev = *made.value();
  auto host = MakeCore();
  auto requests = [logprobs_row](const EngineCore& core) {
    std::vector<GenerationRequest> reqs;
    for (uint64_t seed : {1, 2, 3}) {
      reqs.push_back(MakeRequest(core, "json" + std::to_string(seed), seed,
                                 {Constraint::Kind::kJsonSchema, kSchema, {}}));
    }
    reqs.push_back(MakeRequest(core, "free", 9));  // unconstrained beside them
    reqs.back().stopping.max_tokens = 40;
    GenerationRequest greedy =
        MakeRequest(core, "greedy", 4, {Constraint::Kind::kRegex, "[a-c]{3,9}", {}});
    greedy.sampling.temperature = 0.0f;
    reqs.push_back(std::move(greedy));
    if (logprobs_row) {
      GenerationRequest lp =
          MakeRequest(core, "logprobs", 6, {Constraint::Kind::kJsonSchema, kSchema, {}});
      lp.sampling.logprobs = 2;
      lp.stopping.max_tokens = 12;
      reqs.push_back(std::move(lp));
    }
    return reqs;
  };
  auto on_device = Run(dev, requests(dev));
  auto on_host = Run(*host, requests(*host));
  CHECK(device->masked_rows > 0);  // the masks went the device way
  if (overlap) {
    // Constrained rows overlapped: their masks were computed while the forward "ran".
    CHECK(device->deferred_launches > 0);
    CHECK(dev.num_overlapped_steps() > 0);
  } else {
    CHECK(device->deferred_launches == 0);
  }
  for (const auto& [id, s] : on_host) {
    INFO(id);
    CHECK(on_device.at(id)->error.ok());
    CHECK(on_device.at(id)->tokens == s->tokens);
    CHECK(on_device.at(id)->reason == s->reason);
  }
  CheckMatchesSchema(on_device.at("json1")->text);
  CHECK(std::regex_match(on_device.at("greedy")->text, std::regex("[a-c]{3,9}")));
  CHECK(dev.num_free_blocks() == dev.num_blocks());
}

TEST_CASE("constrained rows sampled on the device with their masks give the host path's tokens",
          "[structured]") {
  CheckDevicePathMatchesHost(/*overlap=*/false, /*threads=*/1, /*logprobs_row=*/false);
}

// The masks of step k + 1 wait for step k's tokens: the engine launches k + 1's forward, reads k
// back, advances the grammars and only then fills the masks (on several threads here), which the
// sampling takes. A request with logprobs makes some steps synchronous in between.
TEST_CASE("constrained rows in overlapped steps, masks filled while the forward runs",
          "[structured]") {
  CheckDevicePathMatchesHost(/*overlap=*/true, /*threads=*/3, /*logprobs_row=*/false);
  CheckDevicePathMatchesHost(/*overlap=*/true, /*threads=*/2, /*logprobs_row=*/true);
}

TEST_CASE("a complete grammar ends the request even with ignore_eos and min_tokens",
          "[structured]") {
  auto core = MakeCore();
  GenerationRequest r = MakeRequest(*core, "c", 5, {Constraint::Kind::kChoice, "", {"ok"}});
  r.stopping.ignore_eos = true;
  r.stopping.min_tokens = 50;
  std::vector<GenerationRequest> reqs;
  reqs.push_back(std::move(r));
  auto sinks = Run(*core, std::move(reqs));
  CHECK(sinks["c"]->text == "ok");
  CHECK(sinks["c"]->reason == FinishReason::kStop);
  CHECK(sinks["c"]->tokens.back() == 769);
}

TEST_CASE("requests that ask for a grammar being compiled wait for that compile", "[structured]") {
  // A compile builds the grammar's token cache; eight requests for one new schema at once run it
  // once and share its result, and a bad schema's error reaches every one of them.
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(std::string(1, static_cast<char>(b)));
  for (const char* t : {"{\"", "\":", "\",", "name", "age", "12", "true", "  "})
    tokens.push_back(t);
  tokens.push_back("<eos>");
  const int32_t eos = static_cast<int32_t>(tokens.size()) - 1;
  GrammarCache cache(grammar::Vocabulary::Create(tokens, {eos}), 4);
  for (const char* schema : {kSchema, R"({"type": "object", "patternProperties": {}})"}) {
    INFO(schema);
    const bool good = schema == kSchema;
    const size_t before = cache.compiles();
    std::latch start(8);
    std::vector<std::shared_ptr<const grammar::CompiledGrammar>> got(8);
    std::vector<uint8_t> ok(8);  // not vector<bool>: its bits share words the threads write
    std::vector<std::thread> threads;
    for (int i = 0; i < 8; ++i) {
      threads.emplace_back([&, i] {
        start.arrive_and_wait();
        auto r = cache.Get(Constraint{Constraint::Kind::kJsonSchema, schema, {}});
        ok[i] = r.ok() ? 1 : 0;
        if (r.ok()) got[i] = r.value();
      });
    }
    for (auto& t : threads) t.join();
    for (int i = 0; i < 8; ++i) {
      CHECK((ok[i] != 0) == good);
      CHECK(got[i] == got[0]);
    }
    // Racing threads may arrive after the compile ended: a good schema is then a cache hit, a bad
    // one (errors are not kept) compiles again; either way not once per thread at once.
    if (good) CHECK(cache.compiles() == before + 1);
  }
  CHECK(cache.size() == 1);
}

TEST_CASE("bad constraints are refused by name", "[structured]") {
  auto core = MakeCore();
  auto refuse = [&](Constraint c, const std::string& needle) {
    GenerationRequest r = MakeRequest(*core, "bad", 1, std::move(c));
    const Status st = core->Validate(&r);
    INFO(st.ToString());
    CHECK(st.code() == StatusCode::kInvalidArgument);
    CHECK(st.message().find(needle) != std::string::npos);
  };
  refuse({Constraint::Kind::kJsonSchema, R"({"type": "object", "patternProperties": {}})", {}},
         "patternProperties");
  refuse({Constraint::Kind::kJsonSchema, "{not json", {}}, "json_schema");
  refuse({Constraint::Kind::kRegex, "(?=a)b", {}}, "regex");
  refuse({Constraint::Kind::kGrammar, "root ::= undefined_rule", {}}, "undefined_rule");
  refuse({Constraint::Kind::kChoice, "", {}}, "choice");
  refuse({Constraint::Kind::kRegex, std::string(70000, 'a'), {}}, "max_constraint_bytes");
}

}  // namespace
}  // namespace llm
