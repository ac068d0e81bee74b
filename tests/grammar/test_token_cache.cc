// The per-position token cache (grammar/token_cache.h): masks built from entries computed at
// compile time, with context expansion, equal a brute-force mask (AcceptToken on every token) on
// random schemas and states, on both tokenizer styles and on real vocabularies; entries computed on
// first use (past the precompute budget) give the same masks; and context expansion decides tokens
// that cross a rule's end.
#include <nlohmann/json.hpp>

#include "tests/grammar/grammar_test_util.h"

namespace llm::grammar::testing {
namespace {

// A random JSON Schema of the kinds the bench uses: objects, bounded strings, enums, integer
// ranges, numbers, arrays, nullable unions, formats.
nlohmann::json RandomSchema(std::mt19937& rng, int depth) {
  using nlohmann::json;
  switch (rng() % (depth > 0 ? 8 : 6)) {
    case 0:
      return {{"type", "string"}, {"maxLength", 1 + rng() % 6}};
    case 1:
      return {{"enum", {"cat", "dog", "a\"b"}}};
    case 2:
      return {{"type", "integer"}, {"minimum", -3}, {"maximum", 40 + rng() % 100}};
    case 3:
      return {{"type", {"number", "null"}}};
    case 4:
      return {{"type", "string"}, {"format", rng() % 2 ? "date" : "uuid"}};
    case 5:
      return {{"type", "boolean"}};
    case 6:
      return {{"type", "array"}, {"items", RandomSchema(rng, depth - 1)}, {"maxItems", 3}};
    default: {
      json props = json::object();
      json required = json::array();
      int n = 1 + rng() % 3;
      for (int i = 0; i < n; ++i) {
        std::string name = std::string(1, static_cast<char>('a' + i)) + (rng() % 2 ? "b" : "");
        props[name] = RandomSchema(rng, depth - 1);
        if (rng() % 2) required.push_back(name);
      }
      return {{"type", "object"},
              {"properties", props},
              {"required", required},
              {"additionalProperties", false}};
    }
  }
}

TEST_CASE("token cache: masks equal brute force on random schemas, precomputed or on first use",
          "[grammar][mask][token_cache]") {
  auto style = GENERATE(0, 1);
  auto vocab = style == 0 ? ByteLevelVocab() : SentencePieceVocab();
  INFO((style == 0 ? "byte-level" : "sentencepiece"));
  std::mt19937 rng(7 + style);
  JsonSchemaOptions opt;
  opt.max_whitespace = 2;
  for (int i = 0; i < 12; ++i) {
    nlohmann::json schema = RandomSchema(rng, 3);
    INFO(schema.dump());
    auto g = CompileJsonSchema(schema.dump(), opt);
    REQUIRE(g.ok());
    auto eager = CompiledGrammar::Create(g.value(), vocab);
    auto lazy = CompiledGrammar::Create(g.value(), vocab, /*precompute_budget=*/0);
    CHECK(eager->cached_positions() > 0);
    CHECK(lazy->cached_positions() == 0);
    Matcher m(eager);
    RandomWalk(m, 100 + i, 120, /*check=*/true);
    // The lazy grammar gives the same mask at every state of that walk, rolled back step by step.
    Matcher l(lazy);
    std::vector<int32_t> path;
    Matcher replay(eager);
    std::vector<uint32_t> a(vocab->mask_words()), b(vocab->mask_words());
    for (int step = 0; step < 120 && !replay.IsTerminated(); ++step) {
      replay.FillNextTokenBitmask(a.data());
      l.FillNextTokenBitmask(b.data());
      REQUIRE(a == b);
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < static_cast<int32_t>(vocab->size()); ++id)
        if (Bit(a, id)) allowed.push_back(id);
      REQUIRE(!allowed.empty());
      int32_t pick = allowed[rng() % allowed.size()];
      REQUIRE(replay.AcceptToken(pick));
      REQUIRE(l.AcceptToken(pick));
    }
  }
}

TEST_CASE("token cache: context expansion decides tokens that cross a rule's end",
          "[grammar][token_cache]") {
  // str is called from two places, both followed by ","; the body's token `a",` fits both, so
  // it is accepted whatever the stack; `a"x` and `a"]` fit neither (rejected); `a","` fits after
  // the first str (another str follows) but not after the second (uncertain).
  auto g = Must(ParseGbnf(R"(root ::= "[" str "," str "," "]"
str ::= "\"" [a-z]* "\"")"));
  auto vocab = Vocabulary::Create({"a\",", "a\"x", "a\"]", "a", "a\",\"", "\"", "<eos>"}, {6});
  auto cg = CompiledGrammar::Create(g, vocab);
  const auto& pos = g->positions();
  int checked = 0;
  for (uint32_t p = 0; p < pos.size(); ++p) {
    if (pos[p].kind != Position::kByteStar) continue;
    const TokenCacheEntry& e = cg->CacheFor(p);
    std::vector<uint32_t> acc(vocab->mask_words(), 0);
    e.AddAccepted(acc.data());
    CHECK(Bit(acc, 0));
    CHECK_FALSE(Bit(acc, 1));
    CHECK_FALSE(Bit(acc, 2));
    CHECK(Bit(acc, 3));
    CHECK_FALSE(Bit(acc, 4));
    CHECK(e.uncertain == std::vector<int32_t>{4});
    ++checked;
  }
  CHECK(checked == 1);
  // And the masks agree with AcceptToken in both places.
  Matcher m(cg);
  REQUIRE(m.AcceptString("[\"b"));
  CheckMaskMatchesAccept(m);
  REQUIRE(m.AcceptString("\",\"b"));
  CheckMaskMatchesAccept(m);
  REQUIRE(m.AcceptString("\","));
  CheckMaskMatchesAccept(m);
}

TEST_CASE("token cache: tokens that return past the site verdicts are walked on the real stack",
          "[grammar][token_cache]") {
  // From t's body, `a1` returns through u, v and w (each called non-tail) before "1" or "2"
  // decides: deeper than the build-time site verdicts follow, so only the real stack can say.
  auto g = Must(ParseGbnf(R"(root ::= "x" w "1" | "y" w "2"
w ::= v [;]*
v ::= u [:]*
u ::= t [,]*
t ::= [a-z]*)"));
  auto vocab = Vocabulary::Create(
      {"a1", "a2", "a", "1", "2", "x", "y", ";", ":", ",", "a,:;1", "a;2", "<eos>"}, {12});
  auto cg = CompiledGrammar::Create(g, vocab);
  for (const char* prefix : {"x", "y", "xb", "yb,", "xc:"}) {
    INFO(prefix);
    Matcher m(cg);
    REQUIRE(m.AcceptString(prefix));
    CheckMaskMatchesAccept(m);
    std::vector<uint32_t> mask(vocab->mask_words());
    m.FillNextTokenBitmask(mask.data());
    if (std::string(prefix).find_first_of(",:") != std::string::npos) continue;
    bool x = prefix[0] == 'x';
    CHECK(Bit(mask, 0) == x);
    CHECK(Bit(mask, 1) == !x);
  }
}

TEST_CASE("token cache: a rule that may end the output never accepts past its end for sure",
          "[grammar][token_cache]") {
  // item's only call site takes `]`, but after "a" item ends the output (a tail call from the
  // root), where nothing may follow: `1]` depends on the stack.
  auto g = Must(ParseGbnf(R"(root ::= "a" item | "[" item "]x"
item ::= [0-9]*)"));
  auto vocab = Vocabulary::Create({"1]", "1", "]", "x", "a", "[", "<eos>"}, {6});
  auto cg = CompiledGrammar::Create(g, vocab);
  for (const char* prefix : {"a", "[", "a1", "[1"}) {
    INFO(prefix);
    Matcher m(cg);
    REQUIRE(m.AcceptString(prefix));
    CheckMaskMatchesAccept(m);
    std::vector<uint32_t> mask(vocab->mask_words());
    m.FillNextTokenBitmask(mask.data());
    CHECK(Bit(mask, 0) == (prefix[0] == '['));
  }
}

TEST_CASE("token cache: masks equal brute force on real vocabularies",
          "[grammar][real][token_cache]") {
  struct Tok {
    const char* name;
    int32_t eos;
  };
  auto t = GENERATE(Tok{"llama3", 128009}, Tok{"qwen3", 151645}, Tok{"llama2", 2});
  std::string text = CachedTokenizer(t.name);
  if (text.empty()) {
    WARN(std::string("tokenizer cache has no ") + t.name + ": skipped");
    return;
  }
  auto vocab = Vocabulary::FromHfTokenizerJson(text, {t.eos}).value();
  // Bounded strings, a uuid, a bounded number, an enum with a space, an email (its domain labels
  // return at every character), a pattern and a recursive $ref.
  auto g = Must(CompileJsonSchema(R"({"type": "object", "properties": {
      "items": {"type": "array", "maxItems": 3, "items": {"type": "object", "properties": {
        "title": {"type": "string", "maxLength": 12}, "id": {"type": "string", "format": "uuid"},
        "score": {"type": "number", "minimum": 0, "maximum": 1}},
        "required": ["title", "score"], "additionalProperties": false}},
      "kind": {"enum": ["a", "b c"]}, "email": {"type": "string", "format": "email"},
      "zip": {"type": "string", "pattern": "^[0-9]{5}$"}, "tree": {"$ref": "#/$defs/node"}},
      "required": ["items", "email"], "additionalProperties": false,
      "$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
        "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
        "additionalProperties": false}}})"));
  auto cg = CompiledGrammar::Create(g, vocab);
  // From the start and from inside each part, a few random steps with every mask checked.
  for (const char* prefix :
       {"", "{\"items\": [{\"title\": \"a", "{\"items\": [{\"title\": \"\", \"id\": \"0",
        "{\"items\": [], \"kind\": \"b", "{\"items\": [],\n \"email\": \"ab",
        "{\"items\": [], \"email\": \"a.b@c", "{\"items\": [], \"email\": \"a@b.cd",
        "{\"items\": [], \"email\": \"a@b.cd\", \"zip\": \"12",
        "{\"items\": [], \"email\": \"a@b.cd\", \"tree\": {\"kids\": [{\"v\": 1"}) {
    INFO(prefix);
    Matcher m(cg);
    REQUIRE(m.AcceptString(prefix));
    RandomWalk(m, /*seed=*/1, 8, /*check=*/true);
  }
}

}  // namespace
}  // namespace llm::grammar::testing
