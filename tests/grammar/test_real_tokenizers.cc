// Real tokenizer.json files (scripts/fetch_tokenizers.sh fills the cache; skipped with a message
// when it is absent): the loader's byte strings, and JSON generated token by token that ends by
// itself, on a byte-level BPE (Qwen3) and a SentencePiece byte-fallback vocabulary (Llama 2).
#include <nlohmann/json.hpp>

#include "tests/grammar/grammar_test_util.h"

namespace llm::grammar::testing {
namespace {

struct RealTokenizer {
  const char* name;
  int32_t eos;
  bool byte_level;
};

TEST_CASE("real tokenizers: byte strings and constrained generation", "[grammar][real]") {
  auto t = GENERATE(RealTokenizer{"qwen3", 151645, true}, RealTokenizer{"llama2", 2, false});
  std::string text = CachedTokenizer(t.name);
  if (text.empty()) {
    WARN(std::string("tokenizer cache has no ") + t.name +
         " (run scripts/fetch_tokenizers.sh): skipped");
    return;
  }
  auto v = Vocabulary::FromHfTokenizerJson(text, {t.eos});
  REQUIRE(v.ok());
  auto vocab = v.value();
  CHECK(vocab->byte_level() == t.byte_level);
  size_t with_space = 0, single_bytes = 0;
  for (int32_t id = 0; id < static_cast<int32_t>(vocab->size()); ++id) {
    const std::string& s = vocab->token(id);
    with_space += !s.empty() && s[0] == ' ';
    single_bytes += s.size() == 1;
    // No tokenizer alphabet leaks into the bytes: no GPT-2 'Ġ' (U+0120), no metaspace.
    if (vocab->IsOrdinary(id)) {
      CHECK(s.find("\xE2\x96\x81") == std::string::npos);
    }
  }
  CHECK(with_space > 1000);
  CHECK(single_bytes >= 256);  // every byte is reachable (byte-level or <0xNN> fallback)
  CHECK_FALSE(vocab->IsOrdinary(t.eos));

  auto g = Must(CompileJsonSchema(R"({"type": "object", "properties": {
      "city": {"type": "string", "maxLength": 8},
      "n": {"type": "integer", "minimum": 0, "maximum": 99},
      "kind": {"enum": ["a", "b"]}}, "required": ["city", "n", "kind"],
      "additionalProperties": false})"));
  auto cg = CompiledGrammar::Create(g, vocab);
  for (uint32_t seed = 1; seed <= 2; ++seed) {
    Matcher m(cg);
    std::string out = RandomWalk(m, seed, 300, /*check=*/false);
    INFO(out);
    REQUIRE(m.IsTerminated());
    auto j = nlohmann::json::parse(out, nullptr, false);
    REQUIRE_FALSE(j.is_discarded());
    CHECK(j["n"].get<int>() <= 99);
    CHECK(j["city"].get<std::string>().size() <= 8 * 4);
  }
  // The mask agrees with AcceptToken on every token of the real vocabulary, at a few points.
  Matcher m(cg);
  CheckMaskMatchesAccept(m);
  REQUIRE(m.AcceptString("{\"city\": \"Par"));
  CheckMaskMatchesAccept(m);
  REQUIRE(m.AcceptString("is\", \"n\": 4"));
  CheckMaskMatchesAccept(m);
}

}  // namespace
}  // namespace llm::grammar::testing

namespace llm::grammar::testing {
namespace {

TEST_CASE("real tokenizers: a forced gpt-oss call may use its special header tokens",
          "[grammar][real]") {
  std::string text = CachedTokenizer("gptoss");
  if (text.empty()) {
    WARN("tokenizer cache has no gptoss (run scripts/fetch_tokenizers.sh): skipped");
    return;
  }
  auto v = Vocabulary::FromHfTokenizerJson(text, {200012});  // <|call|>
  REQUIRE(v.ok());
  auto vocab = v.value();
  const int32_t channel = 200005, message = 200008;
  REQUIRE(vocab->token(channel) == "<|channel|>");
  REQUIRE(vocab->IsSpecial(channel));
  auto g = Must(CompileTaggedJsonSchemas(R"({"items": [{"begin":
      " to=functions.f<|channel|>commentary json<|message|>", "schema": {"enum": [1]}}]})"));
  Matcher m(CompiledGrammar::Create(g, vocab));
  REQUIRE(m.AcceptString(" to=functions.f"));
  std::vector<uint32_t> mask(vocab->mask_words());
  m.FillNextTokenBitmask(mask.data());
  CHECK(((mask[channel >> 5] >> (channel & 31)) & 1u) == 1u);
  REQUIRE(m.AcceptToken(channel));
  REQUIRE(m.AcceptString("commentary json"));
  REQUIRE(m.AcceptToken(message));
  REQUIRE(m.AcceptString("1"));
  CHECK(m.CanTerminate());
}

}  // namespace
}  // namespace llm::grammar::testing
