// GBNF, regex and choice grammars: byte-level acceptance, masks on both tokenizer styles,
// rollback and completion.
#include <thread>

#include "tests/grammar/grammar_test_util.h"

namespace llm::grammar::testing {
namespace {

TEST_CASE("gbnf: literals, classes, groups, repetition", "[grammar][gbnf]") {
  auto g = Must(ParseGbnf(R"g(
    # a comment
    root ::= greeting " " name ("!" | "?")?
    greeting ::= "hello" | "hi"
    name ::= [A-Z] [a-z]{1,4}
  )g"));
  CHECK(Accepts(g, "hello Bob"));
  CHECK(Accepts(g, "hi Alice!"));
  CHECK(Accepts(g, "hi Ab?"));
  CHECK_FALSE(Accepts(g, "hi A"));       // {1,4}: at least one lower-case letter
  CHECK_FALSE(Accepts(g, "hi Abcdef"));  // at most four
  CHECK_FALSE(Accepts(g, "hey Bob"));
  CHECK(AcceptsPrefix(g, "hell"));
  CHECK_FALSE(Accepts(g, "hell"));
}

TEST_CASE("gbnf: recursion, negated classes, unicode, escapes", "[grammar][gbnf]") {
  auto g = Must(ParseGbnf(R"g(root ::= list
list ::= "(" (item ("," item)*)? ")"
item ::= list | [^(),\n]+ | "\u65e5"
)g"));
  CHECK(Accepts(g, "()"));
  CHECK(Accepts(g, "(a,(b,c),((d)))"));
  CHECK(Accepts(g, "(é,日本)"));
  CHECK_FALSE(Accepts(g, "(a,)"));
  CHECK_FALSE(Accepts(g, "((a)"));
  CHECK_FALSE(Accepts(g, "(a\nb)"));
  // A lone UTF-8 lead byte is a prefix, not a character.
  CHECK(AcceptsPrefix(g, "(\xC3"));
  CHECK_FALSE(Accepts(g, "(\xC3)"));
}

TEST_CASE("gbnf: errors name the problem", "[grammar][gbnf]") {
  auto undefined = ParseGbnf("root ::= foo");
  REQUIRE_FALSE(undefined.ok());
  CHECK(undefined.error().find("'foo'") != std::string::npos);
  auto left = ParseGbnf("root ::= expr\nexpr ::= expr \"+\" \"1\" | \"1\"");
  REQUIRE_FALSE(left.ok());
  CHECK(left.error().find("left-recursive") != std::string::npos);
  auto noroot = ParseGbnf("start ::= \"a\"");
  REQUIRE_FALSE(noroot.ok());
  CHECK(noroot.error().find("root") != std::string::npos);
  CHECK_FALSE(ParseGbnf("root ::= \"a").ok());
  CHECK_FALSE(ParseGbnf("root ::= [a").ok());
}

TEST_CASE("regex: the supported subset", "[grammar][regex]") {
  auto g = Must(ParseRegex(R"g(^(\d{3})-[A-Fa-f0-9]{2,}(\.\w+)?\s?x*$)g"));
  CHECK(Accepts(g, "123-ab"));
  CHECK(Accepts(g, "123-abCD.foo_1 xx"));
  CHECK_FALSE(Accepts(g, "12-ab"));
  CHECK_FALSE(Accepts(g, "123-a"));
  CHECK_FALSE(Accepts(g, "123-ab."));
  auto dot = Must(ParseRegex("a.c|[^a-z]+|(?:é|ü){2}"));
  CHECK(Accepts(dot, "a日c"));
  CHECK_FALSE(Accepts(dot, "a\nc"));
  CHECK(Accepts(dot, "ABC 123"));
  CHECK(Accepts(dot, "üé"));
  CHECK_FALSE(Accepts(dot, "a"));
  auto esc = Must(ParseRegex(R"g(\x41\u00e9\.\[\]\\)g"));
  CHECK(Accepts(esc, "Aé.[]\\"));
}

TEST_CASE("regex: refused constructs are named", "[grammar][regex]") {
  auto check = [](const char* re, const char* word) {
    auto r = ParseRegex(re);
    INFO(re);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().find(word) != std::string::npos);
  };
  check("a(?=b)", "lookaround");
  check("a(?<!b)", "lookaround");
  check("(a)\\1", "backreference");
  check("\\bword", "boundary");
  check("a^b", "anchor");
  check("a++", "possessive");
  check("\\p{L}", "Unicode property");
  check("*a", "nothing to repeat");
}

TEST_CASE("choices: exactly one of the strings", "[grammar][choices]") {
  auto g = Must(MakeChoices({"cat", "catalog", "dog"}));
  CHECK(Accepts(g, "cat"));
  CHECK(Accepts(g, "catalog"));
  CHECK(Accepts(g, "dog"));
  CHECK_FALSE(Accepts(g, "ca"));
  CHECK_FALSE(Accepts(g, "dogs"));
  CHECK(AcceptsPrefix(g, "cata"));
}

// The same grammars on both tokenizer styles: the mask agrees with AcceptToken on every token,
// random walks end by themselves with EOS, and rollback restores the exact mask.
TEST_CASE("masks: both tokenizer styles, rollback and completion", "[grammar][mask]") {
  auto style = GENERATE(0, 1);
  auto vocab = style == 0 ? ByteLevelVocab() : SentencePieceVocab();
  INFO((style == 0 ? "byte-level" : "sentencepiece"));
  std::vector<std::shared_ptr<const Grammar>> grammars = {
      Must(
          ParseGbnf("root ::= \"{\" (\"\\\"\" [a-z]{0,3} \"\\\":\" [0-9]{1,3} \",\"?){0,3} \"}\"")),
      Must(ParseRegex("(cat|dog)s?( [0-9]{1,3})?")),
      Must(MakeChoices({"yes", "no", "maybe"})),
      Must(ParseGbnf("root ::= \"hello\" \" \"? [a-z]{0,6}")),
  };
  for (size_t gi = 0; gi < grammars.size(); ++gi) {
    INFO("grammar " << gi);
    auto cg = CompiledGrammar::Create(grammars[gi], vocab);
    for (uint32_t seed = 1; seed <= 6; ++seed) {
      Matcher m(cg);
      std::string text = RandomWalk(m, seed, 60);
      INFO("generated: " << text);
      CHECK(m.IsTerminated());
      CHECK(Accepts(grammars[gi], text));
      // Roll everything back and compare with a fresh matcher's mask.
      std::vector<uint32_t> a(vocab->mask_words()), b(vocab->mask_words());
      m.Rollback(m.num_steps());
      CHECK_FALSE(m.IsTerminated());
      m.FillNextTokenBitmask(a.data());
      Matcher fresh(cg);
      fresh.FillNextTokenBitmask(b.data());
      CHECK(a == b);
    }
  }
}

TEST_CASE("masks: EOS only once complete, specials never, nothing after EOS", "[grammar][mask]") {
  auto vocab = ByteLevelVocab();
  int32_t eos = static_cast<int32_t>(vocab->size()) - 1;
  int32_t special = eos - 1;
  auto cg = CompiledGrammar::Create(Must(MakeChoices({"ab", "abc"})), vocab);
  Matcher m(cg);
  std::vector<uint32_t> mask(vocab->mask_words());
  m.FillNextTokenBitmask(mask.data());
  CHECK_FALSE(Bit(mask, eos));
  CHECK_FALSE(Bit(mask, special));
  CHECK_FALSE(m.AcceptToken(eos));
  CHECK_FALSE(m.AcceptToken(special));
  REQUIRE(m.AcceptString("ab"));
  m.FillNextTokenBitmask(mask.data());
  CHECK(Bit(mask, eos));
  CHECK(Bit(mask, 'c'));
  REQUIRE(m.AcceptString("c"));
  m.FillNextTokenBitmask(mask.data());
  for (int32_t id = 0; id < static_cast<int32_t>(vocab->size()); ++id)
    CHECK(Bit(mask, id) == (id == eos));  // complete and nothing can follow: only EOS
  REQUIRE(m.AcceptToken(eos));
  CHECK(m.IsTerminated());
  m.FillNextTokenBitmask(mask.data());
  for (uint32_t w : mask) CHECK(w == 0);
  CHECK_FALSE(m.AcceptToken('a'));
  m.Rollback(1);  // undo EOS
  CHECK_FALSE(m.IsTerminated());
  CHECK(m.CanTerminate());
  m.Rollback(2);
  CHECK(m.num_steps() == 0);
  CHECK(m.AcceptToken(static_cast<int32_t>(256 + 13)));  // "ab"
}

TEST_CASE("vocabulary: SentencePiece metaspace and byte fallback", "[grammar][vocab]") {
  auto v = SentencePieceVocab();
  bool saw_space_hello = false, saw_byte = false;
  for (int32_t id = 0; id < static_cast<int32_t>(v->size()); ++id) {
    saw_space_hello |= v->token(id) == " hello";
    saw_byte |= v->token(id) == std::string(1, '\x0A');
  }
  CHECK(saw_space_hello);
  CHECK(saw_byte);
  CHECK(v->IsEos(2));
  CHECK_FALSE(v->IsOrdinary(0));
  CHECK_FALSE(v->byte_level());
}

}  // namespace
}  // namespace llm::grammar::testing

namespace llm::grammar::testing {
namespace {

// Requests on different threads share one CompiledGrammar and fill its token cache concurrently;
// every thread's masks must equal those of a single-threaded run.
TEST_CASE("masks: matchers on several threads share one compiled grammar", "[grammar][mask]") {
  auto vocab = ByteLevelVocab();
  auto g = Must(ParseGbnf("root ::= (\"cat\" | \"dog\" | [a-z]{1,5}) (\" \" [0-9]+)? \"!\""));
  std::vector<std::vector<uint32_t>> expected;
  {
    Matcher m(CompiledGrammar::Create(g, vocab));
    for (const char* piece : {"", "d", "o", "g", " ", "1", "2", "!"}) {
      REQUIRE(m.AcceptString(piece));
      expected.emplace_back(vocab->mask_words());
      m.FillNextTokenBitmask(expected.back().data());
    }
  }
  auto shared = CompiledGrammar::Create(g, vocab);
  std::vector<std::vector<std::vector<uint32_t>>> got(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      Matcher m(shared);
      for (const char* piece : {"", "d", "o", "g", " ", "1", "2", "!"}) {
        if (!m.AcceptString(piece)) return;
        got[t].emplace_back(vocab->mask_words());
        m.FillNextTokenBitmask(got[t].back().data());
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) CHECK(got[t] == expected);
}

}  // namespace
}  // namespace llm::grammar::testing
