// Tests for the byte-level BPE tokenizer, the incremental decoder and the BPE trainer.
#include <catch2/catch.hpp>

#include <unistd.h>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/tokenizer/bpe_trainer.h"
#include "text/tokenizer/byte_level.h"
#include "text/tokenizer/tokenizer.h"

namespace llm {
namespace {

using json = nlohmann::json;
using tokenizer_internal::ByteLevelToBytes;
using tokenizer_internal::BytesToByteLevel;
using tokenizer_internal::ByteToUnicode;
using tokenizer_internal::IsValidUtf8;
using tokenizer_internal::Regex;
using tokenizer_internal::SanitizeUtf8;

const std::string kFffd = "\xEF\xBF\xBD";

// A hand-written tokenizer whose encodings are worked out by hand in the tests below. Merges
// use both serializations ("a b" strings and ["a", "b"] arrays).
const char* kTinyJson = R"json({
  "version": "1.0",
  "added_tokens": [
    {"id": 16, "content": "<|bos|>", "special": true},
    {"id": 17, "content": "<|eos|>", "special": true},
    {"id": 18, "content": "<think>", "special": false}
  ],
  "normalizer": {"type": "NFC"},
  "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
                    "use_regex": true},
  "post_processor": {"type": "Sequence", "processors": [
    {"type": "ByteLevel", "trim_offsets": false},
    {"type": "TemplateProcessing",
     "single": [{"SpecialToken": {"id": "<|bos|>", "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}}],
     "pair": [],
     "special_tokens": {"<|bos|>": {"id": "<|bos|>", "ids": [16], "tokens": ["<|bos|>"]}}}
  ]},
  "decoder": {"type": "ByteLevel"},
  "model": {
    "type": "BPE", "dropout": null, "unk_token": null, "ignore_merges": false,
    "vocab": {"h": 0, "e": 1, "l": 2, "o": 3, "Ġ": 4, "w": 5, "r": 6, "d": 7, "he": 8,
              "ll": 9, "hell": 10, "hello": 11, "Ġw": 12, "or": 13, "Ġwor": 14, "!": 15,
              "lo": 19},
    "merges": ["h e", ["l", "l"], "he ll", ["hell", "o"], "Ġ w", "o r", ["Ġw", "or"]]
  }
})json";

std::unique_ptr<Tokenizer> Load(const json& j) {
  auto tok = Tokenizer::FromJson(j);
  INFO(tok.status().ToString());
  REQUIRE(tok.ok());
  return std::move(tok).value();
}

std::vector<int32_t> Ids(std::initializer_list<int32_t> ids) {
  return ids;
}

std::string ErrorOf(const json& j) {
  auto tok = Tokenizer::FromJson(j);
  REQUIRE_FALSE(tok.ok());
  CHECK(tok.status().code() == StatusCode::kInvalidArgument);
  return tok.status().message();
}

std::vector<std::string> Split(const char* pattern, std::string_view text) {
  auto re = Regex::Compile(pattern);
  REQUIRE(re.ok());
  return re.value()->Matches(text);
}

using Strings = std::vector<std::string>;

// Deterministic ~50 KB corpus mixing English, accented Latin, CJK, emoji, digits, code.
std::string MakeCorpus(size_t bytes) {
  const std::vector<std::string> words = {
      "the",    "quick",  "brown", "fox",       "jumps", "over",   "lazy",      "dog",
      "server", "token",  "model", "inference", "batch", "cache",  "attention", "layer",
      "it's",   "we'll",  "don't", "café",      "naïve", "résumé", "Über",      "東京",
      "日本語", "模型",   "😀",     "🚀",         "42",    "2024",   "3.14159",   "x = y + 1;",
      "(a, b)", "return", "\n",    "\n\n",      "  ",    "\t",     "!",         "?"};
  // Made-up words from syllables keep the pair statistics rich enough for 256 merges.
  const std::vector<std::string> syllables = {"ka",  "to",  "ri", "mon", "sel", "va", "qu", "ent",
                                              "ion", "ber", "é",  "ß",   "語",  "の", "ль", "да"};
  std::mt19937 rng(1234);
  std::string out;
  while (out.size() < bytes) {
    if (rng() % 3 == 0) {
      for (int k = 1 + rng() % 4; k > 0; --k) out += syllables[rng() % syllables.size()];
    } else {
      out += words[rng() % words.size()];
    }
    out += rng() % 5 == 0 ? ". " : " ";
  }
  return out;
}

const Tokenizer& TrainedTokenizer() {
  static const std::unique_ptr<Tokenizer> tok = [] {
    auto t = Tokenizer::FromJson(TrainByteLevelBpe(MakeCorpus(50000), BpeTrainerConfig{}));
    LLM_CHECK(t.ok()) << t.status().ToString();
    return std::move(t).value();
  }();
  return *tok;
}

// Random well-formed text drawn from several scripts.
std::string RandomUnicode(std::mt19937& rng, int max_chars) {
  static const std::vector<std::pair<uint32_t, uint32_t>> ranges = {
      {0x20, 0x7E},       {0x20, 0x7E},       {0x0A, 0x0A},       {0x09, 0x0D},
      {0xA0, 0xFF},       {0x100, 0x17F},     {0x370, 0x3FF},     {0x400, 0x4FF},
      {0x300, 0x36F},     {0x4E00, 0x9FFF},   {0x3040, 0x30FF},   {0xAC00, 0xD7A3},
      {0x1F300, 0x1F64F}, {0x1F900, 0x1F9FF}, {0x10000, 0x10FFFF}};
  std::string out;
  int n = static_cast<int>(rng() % (max_chars + 1));
  for (int i = 0; i < n; ++i) {
    auto [lo, hi] = ranges[rng() % ranges.size()];
    uint32_t cp = lo + rng() % (hi - lo + 1);
    tokenizer_internal::AppendUtf8(cp, &out);
  }
  return out;
}

std::string RandomBytes(std::mt19937& rng, int max_len) {
  std::string out;
  int n = static_cast<int>(rng() % (max_len + 1));
  for (int i = 0; i < n; ++i) {
    // Bias toward bytes that form (broken) multi-byte sequences.
    uint32_t r = rng() % 4;
    out.push_back(static_cast<char>(r == 0   ? 'a' + rng() % 26
                                    : r == 1 ? 0x80 + rng() % 64
                                             : rng() % 256));
  }
  return out;
}

// A vocabulary of all 256 byte symbols, byte b at id b, plus the given merges.
json ByteVocabJson(const json& pre_tokenizer, const Strings& merges) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteToUnicode()[b]] = b;
  int next = 256;
  for (const std::string& m : merges) {
    size_t sp = m.find(' ');
    vocab[m.substr(0, sp) + m.substr(sp + 1)] = next++;
  }
  return {{"pre_tokenizer", pre_tokenizer},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}}};
}

json SplitThenBytes(const json& split) {
  return {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array(
           {split, {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
}

}  // namespace

TEST_CASE("GPT-2 byte alphabet is reversible", "[tokenizer]") {
  CHECK(ByteToUnicode()[' '] == "Ġ");
  CHECK(ByteToUnicode()['\n'] == "Ċ");
  CHECK(ByteToUnicode()['a'] == "a");
  CHECK(ByteToUnicode()[0] == "Ā");
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  std::string mapped = BytesToByteLevel(all);
  CHECK(IsValidUtf8(mapped));
  CHECK(ByteLevelToBytes(mapped) == all);
  // A token with a character outside the alphabet is taken verbatim.
  CHECK(ByteLevelToBytes("<|x|> ") == "<|x|> ");
}

TEST_CASE("UTF-8 sanitizer replaces maximal ill-formed subparts", "[tokenizer]") {
  CHECK(SanitizeUtf8("abc é 東 😀") == "abc é 東 😀");
  CHECK(SanitizeUtf8("\xC3") == kFffd);
  CHECK(SanitizeUtf8("\xE2\x82") == kFffd);
  CHECK(SanitizeUtf8("\xE2\x82"
                     "A") == kFffd + "A");
  CHECK(SanitizeUtf8("\xFF\xFE") == kFffd + kFffd);
  CHECK(SanitizeUtf8("\xC0\x80") == kFffd + kFffd);                          // overlong
  CHECK(SanitizeUtf8("\xED\xA0\x80") == kFffd + kFffd + kFffd);              // surrogate
  CHECK(SanitizeUtf8("\xF4\x90\x80\x80") == kFffd + kFffd + kFffd + kFffd);  // > U+10FFFF
  CHECK(SanitizeUtf8("\xF0\x9F\x98") == kFffd);
  std::string out;
  CHECK(tokenizer_internal::AppendSanitizedUtf8("a\xF0\x9F\x98", false, &out) == 1);
  CHECK(out == "a");
  CHECK(tokenizer_internal::AppendSanitizedUtf8("a\xF0\x9F"
                                                "b",
                                                false, &out) == 4);
  CHECK(out == "aa" + kFffd + "b");
}

TEST_CASE("GPT-2 regex splits words, contractions, numbers and spaces", "[tokenizer]") {
  CHECK(Split(kGpt2PretokenizerRegex, "Hello world's 123") ==
        Strings{"Hello", " world", "'s", " 123"});
  CHECK(Split(kGpt2PretokenizerRegex, "a\n\nb") == Strings{"a", "\n", "\n", "b"});
  CHECK(Split(kGpt2PretokenizerRegex, "HE'S 1234567 x") ==
        Strings{"HE", "'", "S", " 1234567", " x"});
  CHECK(Split(kGpt2PretokenizerRegex, "  hello  there\n") ==
        Strings{" ", " hello", " ", " there", "\n"});
  CHECK(Split(kGpt2PretokenizerRegex, "naïve café 東京 😀!") ==
        Strings{"naïve", " café", " 東京", " 😀!"});
  CHECK(Split(kGpt2PretokenizerRegex, "foo!!\n\nbar") == Strings{"foo", "!!", "\n", "\n", "bar"});
}

TEST_CASE("Llama-3 and Qwen2 regexes group digits and newlines differently", "[tokenizer]") {
  CHECK(Split(kLlama3PretokenizerRegex, "Hello world's 123") ==
        Strings{"Hello", " world", "'s", " ", "123"});
  CHECK(Split(kLlama3PretokenizerRegex, "a\n\nb") == Strings{"a", "\n\n", "b"});
  CHECK(Split(kLlama3PretokenizerRegex, "HE'S 1234567 x") ==
        Strings{"HE", "'S", " ", "123", "456", "7", " x"});
  CHECK(Split(kLlama3PretokenizerRegex, "foo!!\n\nbar") == Strings{"foo", "!!\n\n", "bar"});
  CHECK(Split(kLlama3PretokenizerRegex, "x\t \ny") == Strings{"x", "\t \n", "y"});
  CHECK(Split(kQwen2PretokenizerRegex, "$100.50?") ==
        Strings{"$", "1", "0", "0", ".", "5", "0", "?"});
  CHECK(Split(kLlama3PretokenizerRegex, "$100.50?") == Strings{"$", "100", ".", "50", "?"});
}

TEST_CASE("invalid regex is an error, not a crash", "[tokenizer]") {
  auto re = Regex::Compile("(unclosed");
  CHECK_FALSE(re.ok());
}

TEST_CASE("tiny tokenizer encodes to hand-computed ids", "[tokenizer]") {
  auto tok = Load(json::parse(kTinyJson));
  // "hello": h e l l o -> he l l o -> he ll o -> hell o -> hello.
  // " world": Ġ w o r l d -> Ġw o r l d -> Ġw or l d -> Ġwor l d.
  CHECK(tok->Encode("hello world!", false) == Ids({11, 14, 2, 7, 15}));
  CHECK(tok->Encode("held", false) == Ids({8, 2, 7}));
  // Equal ranks merge leftmost first; the result is the same either way here.
  CHECK(tok->Encode("hellohello", false) == Ids({11, 11}));
  // "  hello" -> " " + " hello"; (Ġ, h) has no merge.
  CHECK(tok->Encode("  hello", false) == Ids({4, 4, 11}));
  // "lo" is in the vocab but no merge builds it.
  CHECK(tok->Encode("lo", false) == Ids({2, 3}));
  CHECK(tok->Encode("", false).empty());
  CHECK(tok->Encode("", true) == Ids({16}));
  CHECK(tok->Decode(Ids({11, 14, 2, 7, 15}), false) == "hello world!");
  CHECK(tok->TokenBytes(4) == " ");
  CHECK(tok->TokenBytes(12) == " w");
  CHECK(tok->TokenToId("Ġw") == 12);
  CHECK(tok->TokenToId("<think>") == 18);
  CHECK_FALSE(tok->TokenToId("zzz").has_value());
  CHECK(tok->vocab_size() == 20);
}

TEST_CASE("added tokens are matched before pre-tokenization and never merged", "[tokenizer]") {
  auto tok = Load(json::parse(kTinyJson));
  CHECK(tok->Encode("hello<|eos|>hello", true) == Ids({16, 11, 17, 11}));
  CHECK(tok->Encode("hello<|eos|>hello", false) == Ids({11, 17, 11}));
  CHECK(tok->Encode("hello<think>world", false) == Ids({11, 18, 5, 13, 2, 7}));
  CHECK(tok->Encode("<|bos|><|eos|>", false) == Ids({16, 17}));
  CHECK(tok->bos_token_id() == 16);
  CHECK(tok->IsSpecial(16));
  CHECK(tok->IsSpecial(17));
  CHECK_FALSE(tok->IsSpecial(18));
  CHECK_FALSE(tok->IsSpecial(11));
  CHECK_FALSE(tok->IsSpecial(-1));
  CHECK(tok->TokenBytes(17) == "<|eos|>");
  CHECK(tok->Decode(Ids({16, 11, 17}), false) == "<|bos|>hello<|eos|>");
  CHECK(tok->Decode(Ids({16, 11, 18, 17}), true) == "hello<think>");
  // Out-of-range ids decode to nothing.
  CHECK(tok->Decode(Ids({-1, 11, 1000}), false) == "hello");
  CHECK(tok->TokenBytes(1000).empty());
}

TEST_CASE("longest added token wins at a position", "[tokenizer]") {
  json j = json::parse(kTinyJson);
  j["added_tokens"].push_back({{"id", 20}, {"content", "<|eos|>!"}, {"special", true}});
  auto tok = Load(j);
  CHECK(tok->Encode("he<|eos|>!<|eos|>", false) == Ids({8, 20, 17}));
}

TEST_CASE("ignore_merges emits whole-word vocab entries", "[tokenizer]") {
  json j = json::parse(kTinyJson);
  j["model"]["ignore_merges"] = true;
  auto tok = Load(j);
  CHECK(tok->Encode("lo", false) == Ids({19}));
  CHECK(tok->Encode("hello world!", false) == Ids({11, 14, 2, 7, 15}));
}

TEST_CASE("ByteLevel add_prefix_space prepends a space", "[tokenizer]") {
  json j = json::parse(kTinyJson);
  j["pre_tokenizer"]["add_prefix_space"] = true;
  auto tok = Load(j);
  CHECK(tok->Encode("hello", false) == Ids({4, 11}));
  CHECK(tok->Encode(" hello", false) == Ids({4, 11}));
}

TEST_CASE("no post-processor means no BOS", "[tokenizer]") {
  json j = json::parse(kTinyJson);
  j["post_processor"] = nullptr;
  auto tok = Load(j);
  CHECK_FALSE(tok->bos_token_id().has_value());
  CHECK(tok->Encode("hello", true) == Ids({11}));
}

TEST_CASE("Split pre-tokenizer behaviors", "[tokenizer]") {
  const Strings merges = {"a -", "- b", "- -"};  // ids 256, 257, 258
  auto with = [&](const char* behavior) {
    json split = {{"type", "Split"},
                  {"pattern", {{"String", "-"}}},
                  {"behavior", behavior},
                  {"invert", false}};
    return Load(ByteVocabJson(SplitThenBytes(split), merges));
  };
  CHECK(with("Isolated")->Encode("a-b", false) == Ids({'a', '-', 'b'}));
  CHECK(with("MergedWithPrevious")->Encode("a-b", false) == Ids({256, 'b'}));
  CHECK(with("MergedWithNext")->Encode("a-b", false) == Ids({'a', 257}));
  CHECK(with("Removed")->Encode("a-b", false) == Ids({'a', 'b'}));
  CHECK(with("Contiguous")->Encode("a--b", false) == Ids({'a', 258, 'b'}));
  CHECK(with("Isolated")->Encode("a--b", false) == Ids({'a', '-', '-', 'b'}));

  // Regex patterns: Llama-3 style digit groups keep "12" and "34" apart.
  json split = {{"type", "Split"},
                {"pattern", {{"Regex", "\\p{N}{1,2}"}}},
                {"behavior", "Isolated"},
                {"invert", false}};
  auto tok = Load(ByteVocabJson(SplitThenBytes(split), {"1 2", "2 3", "3 4"}));
  CHECK(tok->Encode("1234", false) == Ids({256, 258}));
}

TEST_CASE("unsupported components are errors naming the type", "[tokenizer]") {
  json j = json::parse(kTinyJson);
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  CHECK_THAT(ErrorOf(j), Catch::Contains("Whitespace"));

  j = json::parse(kTinyJson);
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers", json::array({{{"type", "WhitespaceSplit"}}})}};
  CHECK_THAT(ErrorOf(j), Catch::Contains("WhitespaceSplit"));

  j = json::parse(kTinyJson);
  j["model"]["type"] = "WordPiece";
  CHECK_THAT(ErrorOf(j), Catch::Contains("WordPiece"));

  j = json::parse(kTinyJson);
  j["decoder"] = {{"type", "Sequence"}, {"decoders", json::array({{{"type", "CTC"}}})}};
  CHECK_THAT(ErrorOf(j), Catch::Contains("CTC"));

  j = json::parse(kTinyJson);
  j["normalizer"] = {{"type", "BertNormalizer"}};
  CHECK_THAT(ErrorOf(j), Catch::Contains("BertNormalizer"));

  j = json::parse(kTinyJson);
  j["post_processor"] = {{"type", "BertProcessing"}};
  CHECK_THAT(ErrorOf(j), Catch::Contains("BertProcessing"));

  j = json::parse(kTinyJson);
  j["model"]["merges"].push_back("x y");
  CHECK_THAT(ErrorOf(j), Catch::Contains("x y"));

  j = json::parse(kTinyJson);
  j["model"]["vocab"]["h"] = "not a number";
  CHECK_THAT(ErrorOf(j), Catch::Contains("malformed"));

  j = json::parse(kTinyJson);
  j["pre_tokenizer"] = {
      {"type", "Split"}, {"pattern", {{"Regex", "(bad"}}}, {"behavior", "Isolated"}};
  CHECK_THAT(ErrorOf(j), Catch::Contains("(bad"));
}

TEST_CASE("FromFile loads a file and reports missing or bad files", "[tokenizer]") {
  std::string path = "/tmp/test_tokenizer_" + std::to_string(::getpid()) + ".json";
  {
    std::ofstream out(path);
    out << kTinyJson;
  }
  auto tok = Tokenizer::FromFile(path);
  REQUIRE(tok.ok());
  CHECK(tok.value()->Encode("hello", true) == Ids({16, 11}));
  {
    std::ofstream out(path);
    out << "{ not json";
  }
  CHECK(Tokenizer::FromFile(path).status().code() == StatusCode::kInvalidArgument);
  std::remove(path.c_str());
  CHECK(Tokenizer::FromFile(path).status().code() == StatusCode::kNotFound);
}

TEST_CASE("trainer learns hand-checked merges", "[tokenizer][trainer]") {
  BpeTrainerConfig config;
  config.vocab_size = 259;
  // Words: "abab", " abab", " ab". (a,b)=5 first; then (ab,ab)=2 ties (Ġ,ab)=2 and wins
  // lexicographically ("ab" < "Ġ"); then (Ġ,ab)=1 ties (Ġ,abab)=1 and wins ("ab" < "abab").
  json j = TrainByteLevelBpe("abab abab ab", config);
  CHECK(j["model"]["merges"] == json({"a b", "ab ab", "Ġ ab"}));
  CHECK(j["model"]["vocab"]["Ġab"] == 258);
  CHECK(j["model"]["vocab"].size() == 259);
  CHECK(j["added_tokens"][0]["id"] == 259);
  CHECK(j["added_tokens"][0]["content"] == "<|begin_of_text|>");
  CHECK(j["added_tokens"][1]["id"] == 260);
  CHECK(j["post_processor"]["single"][0]["SpecialToken"]["id"] == "<|begin_of_text|>");
  CHECK(j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] == kLlama3PretokenizerRegex);

  auto tok = Load(j);
  CHECK(tok->Encode("abab ab", true) == Ids({259, 257, 258}));
  CHECK(tok->bos_token_id() == 259);

  // The corpus runs out of pairs: the vocabulary stops short, specials keep their ids.
  config.vocab_size = 1000;
  json small = TrainByteLevelBpe("ab", config);
  CHECK(small["model"]["merges"] == json({"a b"}));
  CHECK(small["model"]["vocab"].size() == 257);
  CHECK(small["added_tokens"][0]["id"] == 1000);
  auto small_tok = Load(small);
  CHECK(small_tok->vocab_size() == 1002);
  CHECK(small_tok->Encode("ab", true) == Ids({1000, 256}));
  CHECK(small_tok->Decode(Ids({1000, 256, 500, 1001}), false) ==
        "<|begin_of_text|>ab<|end_of_text|>");
}

TEST_CASE("trainer is deterministic and compresses its corpus", "[tokenizer][trainer]") {
  const std::string corpus = MakeCorpus(50000);
  json a = TrainByteLevelBpe(corpus, BpeTrainerConfig{});
  json b = TrainByteLevelBpe(corpus, BpeTrainerConfig{});
  CHECK(a.dump() == b.dump());
  CHECK(a["model"]["vocab"].size() == 512);
  CHECK(a["model"]["merges"].size() >= 256);
  CHECK(a["version"] == "1.0");
  CHECK(a["model"]["type"] == "BPE");

  const Tokenizer& tok = TrainedTokenizer();
  CHECK(tok.vocab_size() == 514);
  CHECK(tok.bos_token_id() == 512);
  CHECK(tok.IsSpecial(513));
  size_t n = tok.Encode(corpus, false).size();
  INFO("tokens " << n << " bytes " << corpus.size());
  CHECK(n * 3 < corpus.size());
}

TEST_CASE("Decode(Encode(s)) round-trips random text", "[tokenizer]") {
  const Tokenizer& tok = TrainedTokenizer();
  std::mt19937 rng(42);
  for (int i = 0; i < 2000; ++i) {
    std::string s = RandomUnicode(rng, 40);
    INFO("text: " << s);
    auto ids = tok.Encode(s, false);
    REQUIRE(tok.Decode(ids, false) == s);
    auto with_bos = tok.Encode(s, true);
    REQUIRE(with_bos.size() == ids.size() + 1);
    CHECK(with_bos[0] == 512);
    REQUIRE(tok.Decode(with_bos, true) == s);
  }
  // Special-token text embedded in ordinary text survives as one id.
  std::string s = "héllo <|end_of_text|> 東京";
  auto ids = tok.Encode(s, false);
  CHECK(std::count(ids.begin(), ids.end(), 513) == 1);
  CHECK(tok.Decode(ids, false) == s);
  CHECK(tok.Decode(ids, true) == "héllo  東京");
}

TEST_CASE("invalid UTF-8 input becomes U+FFFD consistently", "[tokenizer]") {
  const Tokenizer& tok = TrainedTokenizer();
  std::mt19937 rng(7);
  for (int i = 0; i < 2000; ++i) {
    std::string raw = RandomBytes(rng, 24);
    std::string expected = SanitizeUtf8(raw);
    REQUIRE(IsValidUtf8(expected));
    auto ids = tok.Encode(raw, false);
    REQUIRE(ids == tok.Encode(expected, false));
    REQUIRE(tok.Decode(ids, false) == expected);
  }
}

TEST_CASE("IncrementalDecoder matches Decode on random token sequences", "[tokenizer]") {
  const Tokenizer& tok = TrainedTokenizer();
  std::mt19937 rng(99);
  for (int trial = 0; trial < 1000; ++trial) {
    bool skip = trial % 2 == 0;
    std::vector<int32_t> ids;
    int n = static_cast<int>(rng() % 30);
    for (int i = 0; i < n; ++i) {
      // Mostly real ids (byte tokens 128..255 make broken sequences), sometimes out of range.
      ids.push_back(rng() % 20 == 0 ? tok.vocab_size() + 3
                                    : static_cast<int32_t>(rng() % tok.vocab_size()));
    }
    IncrementalDecoder dec(tok, skip);
    std::string streamed;
    for (int32_t id : ids) {
      std::string piece = dec.Step(id);
      REQUIRE(IsValidUtf8(piece));
      streamed += piece;
    }
    std::string tail = dec.Flush();
    REQUIRE(IsValidUtf8(tail));
    streamed += tail;
    REQUIRE(streamed == tok.Decode(ids, skip));
    CHECK(dec.Flush().empty());
  }
}

TEST_CASE("IncrementalDecoder holds back split characters", "[tokenizer]") {
  const Tokenizer& tok = TrainedTokenizer();
  // Byte tokens 0xF0 0x9F 0x98 0x80 spell 😀; nothing comes out until the last one.
  IncrementalDecoder dec(tok, false);
  CHECK(dec.Step(0xF0).empty());
  CHECK(dec.Step(0x9F).empty());
  CHECK(dec.Step(0x98).empty());
  CHECK(dec.Step(0x80) == "😀");
  // An impossible continuation is replaced at once, not held.
  CHECK(dec.Step(0xE2) == "");
  CHECK(dec.Step('A') == kFffd + "A");
  CHECK(dec.Step(0xC3) == "");
  CHECK(dec.Flush() == kFffd);

  std::mt19937 rng(5);
  for (int i = 0; i < 200; ++i) {
    std::string s = RandomUnicode(rng, 20);
    IncrementalDecoder d(tok, true);
    std::string streamed;
    for (int32_t id : tok.Encode(s, true)) streamed += d.Step(id);
    CHECK(d.Flush().empty());  // valid text never leaves bytes behind
    REQUIRE(streamed == s);
  }
}

TEST_CASE("Encode is safe to call from several threads", "[tokenizer]") {
  const Tokenizer& tok = TrainedTokenizer();
  std::mt19937 rng(3);
  std::vector<std::string> texts;
  for (int i = 0; i < 200; ++i) texts.push_back(RandomUnicode(rng, 30) + " the model");
  std::vector<std::vector<int32_t>> expected;
  for (const auto& t : texts) expected.push_back(tok.Encode(t, false));
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 5; ++rep) {
        for (size_t i = 0; i < texts.size(); ++i) {
          if (tok.Encode(texts[(i + t * 37) % texts.size()], false) !=
              expected[(i + t * 37) % texts.size()]) {
            ++mismatches[t];
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(mismatches == std::vector<int>(4, 0));
}

}  // namespace llm
