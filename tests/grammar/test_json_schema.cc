// JSON Schema to grammar: each keyword accepts and rejects what it should, refusals name the
// keyword and its location, and masks on both tokenizer styles generate valid JSON that ends.
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "tests/grammar/grammar_test_util.h"

namespace llm::grammar::testing {
namespace {

std::shared_ptr<const Grammar> Schema(const std::string& s, JsonSchemaOptions opt = {}) {
  return Must(CompileJsonSchema(s, opt));
}

TEST_CASE("json schema: types and nullable unions", "[grammar][json]") {
  auto g = Schema(R"({"type": ["string", "null"]})");
  CHECK(Accepts(g, "null"));
  CHECK(Accepts(g, R"("a\"b\\c\n\u00e9é")"));
  CHECK_FALSE(Accepts(g, "1"));
  CHECK_FALSE(Accepts(g, "\"a\nb\""));  // raw control characters are not JSON
  auto any = Schema("true");
  for (const char* v : {"1", "-0.5e+3", "true", "null", "[1, [2], {}]", R"({"a": {"b": [null]}})"})
    CHECK(Accepts(any, v));
  for (const char* v : {"01", "1.", "+1", "[1,]", "{a: 1}", "nul"}) CHECK_FALSE(Accepts(any, v));
  auto none = Schema("false");
  CHECK_FALSE(Accepts(none, "null"));
  auto b = Schema(R"({"anyOf": [{"type": "boolean"}, {"type": "integer"}]})");
  CHECK(Accepts(b, "true"));
  CHECK(Accepts(b, "-12"));
  CHECK_FALSE(Accepts(b, "1.5"));
}

TEST_CASE("json schema: objects", "[grammar][json]") {
  auto g = Schema(R"({"type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "tag": {"const": "x"}},
    "required": ["name"], "additionalProperties": false})");
  CHECK(Accepts(g, R"({"name": "a"})"));
  CHECK(Accepts(g, R"({"name": "a", "age": 3})"));
  CHECK(Accepts(g, R"({"name":"a","tag":"x"})"));
  CHECK(Accepts(g, "{\n  \"name\": \"a\",\n  \"age\": 3\n}"));
  CHECK_FALSE(Accepts(g, R"({"age": 3})"));                 // required
  CHECK_FALSE(Accepts(g, R"({"name": "a", "other": 1})"));  // additionalProperties false
  CHECK_FALSE(Accepts(g, R"({"name": "a", "age": "3"})"));
  CHECK_FALSE(Accepts(g, R"({"name": "a",})"));
  auto extra = Schema(R"({"properties": {"a": {"type": "integer"}},
                          "additionalProperties": {"type": "string"}})");
  CHECK(Accepts(extra, R"({"a": 1, "b": "x", "ab": "y"})"));
  CHECK(Accepts(extra, R"({"b": "x"})"));
  CHECK_FALSE(Accepts(extra, R"({"b": 1})"));
  CHECK_FALSE(Accepts(extra, R"({"a": 1, "a": "x"})"));  // "a" is declared: not an extra key
  CHECK(Accepts(extra, R"({"": "x"})"));
}

TEST_CASE("json schema: arrays", "[grammar][json]") {
  auto g =
      Schema(R"({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3})");
  CHECK(Accepts(g, "[1]"));
  CHECK(Accepts(g, "[1, 2, 3]"));
  CHECK_FALSE(Accepts(g, "[]"));
  CHECK_FALSE(Accepts(g, "[1, 2, 3, 4]"));
  CHECK_FALSE(Accepts(g, "[1, \"a\"]"));
  auto t = Schema(R"({"prefixItems": [{"type": "string"}, {"type": "boolean"}], "items": false})");
  CHECK(Accepts(t, "[]"));
  CHECK(Accepts(t, R"(["a", true])"));
  CHECK_FALSE(Accepts(t, R"(["a", true, 1])"));
  CHECK_FALSE(Accepts(t, R"([true])"));
  auto d7 = Schema(R"({"items": [{"type": "integer"}], "additionalItems": {"type": "string"},
                       "minItems": 2})");
  CHECK(Accepts(d7, R"([1, "a", "b"])"));
  CHECK_FALSE(Accepts(d7, R"([1])"));
  CHECK_FALSE(Accepts(d7, R"([1, 2])"));
}

TEST_CASE("json schema: strings", "[grammar][json]") {
  auto len = Schema(R"({"type": "string", "minLength": 2, "maxLength": 3})");
  CHECK(Accepts(len, R"("ab")"));
  CHECK(Accepts(len, R"("日本語")"));  // code points, not bytes
  CHECK(Accepts(len, R"("a\nb")"));    // an escape is one character
  CHECK_FALSE(Accepts(len, R"("a")"));
  CHECK_FALSE(Accepts(len, R"("abcd")"));
  auto pat = Schema(R"({"type": "string", "pattern": "^[a-z]+-\\d{2}$"})");
  CHECK(Accepts(pat, R"("ab-12")"));
  CHECK_FALSE(Accepts(pat, R"("ab-123")"));
  auto search = Schema(R"({"type": "string", "pattern": "b+"})");  // unanchored: a search
  CHECK(Accepts(search, R"("abbc")"));
  CHECK_FALSE(Accepts(search, R"("ac")"));
  auto quote = Schema(R"({"type": "string", "pattern": "^a\"$"})");
  CHECK(Accepts(quote, R"("a\"")"));
  struct Case {
    const char* format;
    std::vector<const char*> good, bad;
  };
  for (const Case& c : std::vector<Case>{
           {"date", {"2024-02-29", "1999-12-31"}, {"2024-13-01", "2024-1-01", "2024-01-32"}},
           {"time", {"12:30:00Z", "23:59:60.5+01:00"}, {"24:00:00Z", "12:30Z", "12:30:00"}},
           {"date-time", {"2024-01-02T03:04:05Z"}, {"2024-01-02 03:04:05Z"}},
           {"uuid", {"123e4567-e89b-12d3-a456-426614174000"}, {"123e4567e89b12d3a456426614174000"}},
           {"email", {"a.b+c@example.co"}, {"a@b", "@example.com", "a b@example.com"}},
           {"ipv4", {"192.168.0.1", "0.0.0.0"}, {"256.1.1.1", "01.2.3.4", "1.2.3"}}}) {
    auto g = Schema(std::string(R"({"type": "string", "format": ")") + c.format + "\"}");
    for (const char* s : c.good) CHECK(Accepts(g, std::string("\"") + s + "\""));
    for (const char* s : c.bad) CHECK_FALSE(Accepts(g, std::string("\"") + s + "\""));
  }
}

TEST_CASE("json schema: integer ranges are exact", "[grammar][json]") {
  struct Range {
    std::optional<int64_t> lo, hi;
  };
  for (Range r :
       std::vector<Range>{{0, 255}, {-37, 1234}, {-1000, -7}, {5, {}}, {{}, -3}, {100, 100}}) {
    std::string s = R"({"type": "integer")";
    if (r.lo) s += ", \"minimum\": " + std::to_string(*r.lo);
    if (r.hi) s += ", \"maximum\": " + std::to_string(*r.hi);
    auto g = Schema(s + "}");
    INFO(s);
    for (int64_t v = -1500; v <= 1500; ++v) {
      bool in = (!r.lo || v >= *r.lo) && (!r.hi || v <= *r.hi);
      INFO(v);
      REQUIRE(Accepts(g, std::to_string(v)) == in);
    }
    CHECK(Accepts(g, "123456789012") == !r.hi);
    CHECK_FALSE(Accepts(g, "007"));
    CHECK_FALSE(Accepts(g, "-0"));
  }
  auto ex = Schema(R"({"type": "integer", "exclusiveMinimum": 1.5, "exclusiveMaximum": 4})");
  CHECK_FALSE(Accepts(ex, "1"));
  CHECK(Accepts(ex, "2"));
  CHECK(Accepts(ex, "3"));
  CHECK_FALSE(Accepts(ex, "4"));
}

TEST_CASE("json schema: number bounds", "[grammar][json]") {
  auto g = Schema(R"({"type": "number", "minimum": -2, "exclusiveMaximum": 3})");
  for (const char* v : {"-2", "-2.0", "-1.99", "0", "0.5", "2.999", "-0.5"}) CHECK(Accepts(g, v));
  for (const char* v : {"-2.01", "-3", "3", "3.0", "3.5", "10"}) CHECK_FALSE(Accepts(g, v));
}

// Decimal bounds are exact: every number with up to 3 fraction digits in [-3, 3] against the
// arithmetic, for several bound pairs (inclusive and exclusive).
TEST_CASE("json schema: decimal number bounds are exact", "[grammar][json]") {
  struct Bounds {
    const char* schema;
    double lo, hi;
    bool lo_x, hi_x;
  };
  for (const Bounds& b : std::vector<Bounds>{
           {R"({"type": "number", "minimum": 1.1, "maximum": 2.25})", 1.1, 2.25, false, false},
           {R"({"type": "number", "exclusiveMinimum": -1.05, "exclusiveMaximum": 0.5})", -1.05, 0.5,
            true, true},
           {R"({"type": "number", "minimum": -2.5, "exclusiveMaximum": -2.125})", -2.5, -2.125,
            false, true},
           {R"({"type": "number", "exclusiveMinimum": 0.001, "maximum": 0.01})", 0.001, 0.01, true,
            false}}) {
    auto g = Schema(b.schema);
    INFO(b.schema);
    for (int v = -3000; v <= 3000; ++v) {  // v / 1000, compared in integers (no rounding)
      int lo = static_cast<int>(std::lround(b.lo * 1000)),
          hi = static_cast<int>(std::lround(b.hi * 1000));
      bool in = (b.lo_x ? v > lo : v >= lo) && (b.hi_x ? v < hi : v <= hi);
      char buf[32];
      std::snprintf(buf, sizeof buf, "%s%d.%03d", v < 0 ? "-" : "", std::abs(v) / 1000,
                    std::abs(v) % 1000);
      INFO(buf);
      REQUIRE(Accepts(g, buf) == in);
      // The same value with its trailing zeros dropped.
      std::string t = buf;
      while (t.back() == '0') t.pop_back();
      if (t.back() == '.') t.pop_back();
      if (t == "-0") continue;
      REQUIRE(Accepts(g, t) == in);
    }
  }
}

TEST_CASE("json schema: enum, const, allOf, oneOf", "[grammar][json]") {
  auto e = Schema(R"({"enum": ["red", 1, null, {"a": [true]}]})");
  CHECK(Accepts(e, R"("red")"));
  CHECK(Accepts(e, "1"));
  CHECK(Accepts(e, "null"));
  CHECK(Accepts(e, R"({"a": [true]})"));
  CHECK_FALSE(Accepts(e, R"("blue")"));
  auto all = Schema(R"({"allOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"]},
                                  {"properties": {"b": {"type": "string"}}, "required": ["b"]}]})");
  CHECK(Accepts(all, R"({"a": 1, "b": "x"})"));
  CHECK_FALSE(Accepts(all, R"({"a": 1})"));
  auto one = Schema(R"({"oneOf": [{"type": "string"}, {"type": "null"}]})");
  CHECK(Accepts(one, "null"));
}

TEST_CASE("json schema: $ref and $defs with recursion", "[grammar][json]") {
  auto g = Schema(R"({"$ref": "#/$defs/node", "$defs": {"node": {"type": "object",
    "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
    "required": ["v"], "additionalProperties": false}}})");
  CHECK(Accepts(g, R"({"v": 1})"));
  CHECK(Accepts(g, R"({"v": 1, "kids": [{"v": 2, "kids": [{"v": 3}]}, {"v": 4}]})"));
  CHECK_FALSE(Accepts(g, R"({"v": 1, "kids": [{"kids": []}]})"));
  auto self = Schema(R"({"type": "object", "properties": {"next": {"$ref": "#"}}})");
  CHECK(Accepts(self, R"({"next": {"next": {}}})"));
}

TEST_CASE("json schema: refusals name the keyword and where it is", "[grammar][json]") {
  auto r = CompileJsonSchema(R"({"properties": {"a": {"patternProperties": {}}}})");
  REQUIRE_FALSE(r.ok());
  CHECK(r.error() ==
        "JSON Schema: unsupported JSON Schema keyword \"patternProperties\" at /properties/a");
  for (const char* s : {R"({"not": {}})", R"({"multipleOf": 2})", R"({"uniqueItems": true})",
                        R"({"$ref": "http://example.com/x.json"})", R"({"format": "hostname"})",
                        R"({"oneOf": [{"type": "integer"}, {"type": "number"}]})",
                        R"j({"pattern": "(?=a)"})j", R"({"$ref": "#/nowhere"})"}) {
    INFO(s);
    CHECK_FALSE(CompileJsonSchema(s).ok());
  }
  // Annotations do not constrain and are accepted.
  CHECK(CompileJsonSchema(R"({"title": "t", "description": "d", "default": 1, "examples": [1],
                              "$schema": "http://json-schema.org/draft-07/schema#"})")
            .ok());
}

TEST_CASE("json schema: whitespace is bounded", "[grammar][json]") {
  JsonSchemaOptions opt;
  opt.max_whitespace = 2;
  auto g = Schema(R"({"type": "array", "items": {"type": "integer"}})", opt);
  CHECK(Accepts(g, "[ 1,  2 ]"));
  CHECK_FALSE(Accepts(g, "[1,   2]"));
}

TEST_CASE("json schema: masks on both tokenizer styles generate valid JSON",
          "[grammar][json][mask]") {
  auto style = GENERATE(0, 1);
  auto vocab = style == 0 ? ByteLevelVocab() : SentencePieceVocab();
  INFO((style == 0 ? "byte-level" : "sentencepiece"));
  JsonSchemaOptions opt;
  opt.max_whitespace = 1;
  auto g = Schema(R"({"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 4},
      "n": {"type": "integer", "minimum": -5, "maximum": 120},
      "ok": {"type": "boolean"},
      "tags": {"type": "array", "items": {"enum": ["cat", "dog"]}, "maxItems": 2}},
      "required": ["name", "n"], "additionalProperties": false})",
                  opt);
  auto cg = CompiledGrammar::Create(g, vocab);
  for (uint32_t seed = 1; seed <= 5; ++seed) {
    Matcher m(cg);
    std::string text = RandomWalk(m, seed, 200, /*check=*/seed <= 2);
    INFO(text);
    REQUIRE(m.IsTerminated());
    auto j = nlohmann::json::parse(text, nullptr, false);
    REQUIRE_FALSE(j.is_discarded());
    CHECK(j["n"].get<int>() >= -5);
    CHECK(j["n"].get<int>() <= 120);
    // Roll back half the tokens and finish again.
    int k = m.num_steps() / 2;
    m.Rollback(k);
    RandomWalk(m, seed + 100, 200, false);
    CHECK(m.IsTerminated());
  }
}

}  // namespace
}  // namespace llm::grammar::testing
