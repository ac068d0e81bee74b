// CompileTaggedJsonSchemas: JSON Schema values between fixed texts (forced tool calls).
#include "tests/grammar/grammar_test_util.h"

namespace llm::grammar {
namespace {

using testing::Accepts;
using testing::AcceptsPrefix;
using testing::Must;

TEST_CASE("tagged JSON: prefix, 1..max items of either schema, separator, suffix", "[grammar]") {
  const std::string spec = R"({"prefix": "[", "suffix": "]", "separator": ", ", "max_items": 2,
    "items": [
      {"begin": "<a>", "end": "</a>", "schema": {"type": "object",
        "properties": {"x": {"type": "integer"}}, "required": ["x"],
        "additionalProperties": false}},
      {"begin": "<b>", "schema": {"type": "string", "maxLength": 3}}]})";
  auto g = Must(CompileTaggedJsonSchemas(spec));
  CHECK(Accepts(g, R"([<a>{"x": 1}</a>])"));
  CHECK(Accepts(g, R"([<b>"hey", <a>{"x":2}</a>])"));
  CHECK_FALSE(Accepts(g, R"([])"));                        // at least one
  CHECK_FALSE(Accepts(g, R"([<b>"a", <b>"b", <b>"c"])"));  // at most two
  CHECK_FALSE(Accepts(g, R"([<a>{"x": "1"}</a>])"));       // schema holds
  CHECK_FALSE(Accepts(g, R"([<a>{"x": 1, "y": 2}</a>])"));
  CHECK_FALSE(Accepts(g, R"([<b>"long"])"));
  CHECK_FALSE(Accepts(g, R"([<a>{"x": 1}</a>)"));  // suffix required
  CHECK(AcceptsPrefix(g, R"([<a>{"x": 1)"));
}

TEST_CASE("tagged JSON: the schema's own $ref resolves inside its item", "[grammar]") {
  const std::string spec = R"({"items": [{"begin": "f:", "schema": {
    "$defs": {"n": {"type": "integer"}}, "type": "object",
    "properties": {"a": {"$ref": "#/$defs/n"}}, "required": ["a"],
    "additionalProperties": false}}]})";
  auto g = Must(CompileTaggedJsonSchemas(spec));
  CHECK(Accepts(g, R"(f:{"a": 5})"));
  CHECK_FALSE(Accepts(g, R"(f:{"a": "5"})"));
}

TEST_CASE("tagged JSON: a bad spec or schema is an error naming it", "[grammar]") {
  CHECK_FALSE(CompileTaggedJsonSchemas("not json").ok());
  CHECK_FALSE(CompileTaggedJsonSchemas(R"({"items": []})").ok());
  CHECK_FALSE(CompileTaggedJsonSchemas(R"({"items": [{"begin": "x"}]})").ok());
  CHECK_FALSE(CompileTaggedJsonSchemas(R"({"items": [{"schema": {}}], "max_items": 0})").ok());
  auto r = CompileTaggedJsonSchemas(R"({"items": [{"schema": {"type": "object", "if": {}}}]})");
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().find("if") != std::string::npos);
}

}  // namespace
}  // namespace llm::grammar

namespace llm::grammar {
namespace {

// The mask bit of token `id`.
bool Allowed(Matcher& m, const Vocabulary& v, int32_t id) {
  std::vector<uint32_t> mask(v.mask_words());
  m.FillNextTokenBitmask(mask.data());
  return (mask[id >> 5] >> (id & 31)) & 1u;
}

TEST_CASE("tagged JSON: the model's special tokens may write the fixed texts", "[grammar]") {
  auto vocab = testing::ByteLevelVocab();
  const int32_t special = static_cast<int32_t>(vocab->size()) - 2;  // "<|special|>"
  REQUIRE(vocab->token(special) == "<|special|>");
  auto tagged = testing::Must(CompileTaggedJsonSchemas(
      R"({"items": [{"begin": "<|special|>", "schema": {"enum": [1]}}]})"));
  Matcher m(CompiledGrammar::Create(tagged, vocab));
  CHECK(Allowed(m, *vocab, special));
  REQUIRE(m.AcceptToken(special));
  CHECK_FALSE(Allowed(m, *vocab, special));  // the text is written once
  CHECK(m.AcceptString("1"));
  CHECK(m.CanTerminate());
  // Its bytes one by one work as well.
  Matcher bytes(CompiledGrammar::Create(tagged, vocab));
  CHECK(bytes.AcceptString("<|special|>1"));
  // Other grammars never allow special tokens, even where their text fits.
  auto regex = testing::Must(ParseRegex("<\\|special\\|>1"));
  Matcher r(CompiledGrammar::Create(regex, vocab));
  CHECK_FALSE(Allowed(r, *vocab, special));
  CHECK_FALSE(r.AcceptToken(special));
}

}  // namespace
}  // namespace llm::grammar
