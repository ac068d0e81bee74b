// Shared helpers for the grammar tests: small vocabularies of both tokenizer styles and a brute
// force check that a mask agrees with AcceptToken on every token.
#pragma once

#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "grammar/compiled_grammar.h"
#include "grammar/grammar.h"
#include "grammar/matcher.h"
#include "grammar/vocabulary.h"

namespace llm::grammar::testing {

inline std::shared_ptr<const Grammar> Must(Result<std::shared_ptr<const Grammar>> r) {
  INFO(r.error());
  REQUIRE(r.ok());
  return r.value();
}

// Whole-string acceptance: the bytes are accepted and the grammar may end there.
inline bool Accepts(const std::shared_ptr<const Grammar>& g, const std::string& s) {
  Matcher m(CompiledGrammar::Create(g, nullptr));
  return m.AcceptString(s) && m.CanTerminate();
}
// The bytes are a prefix of some accepted string.
inline bool AcceptsPrefix(const std::shared_ptr<const Grammar>& g, const std::string& s) {
  Matcher m(CompiledGrammar::Create(g, nullptr));
  return m.AcceptString(s);
}

// Byte-level BPE style: every single byte, common multi-byte pieces, EOS last (id = size - 1),
// one special token that must never be allowed.
inline std::shared_ptr<const Vocabulary> ByteLevelVocab() {
  std::vector<std::string> t;
  for (int b = 0; b < 256; ++b) t.push_back(std::string(1, static_cast<char>(b)));
  for (const char* s :
       {"{\"", "\":",   "\",",  "\"}",   "\"",  "true",  "false",  "null", " ",   "  ",
        "\n",  ", ",    ": ",   "ab",    "abc", "hello", " world", "123",  "12",  "-1",
        "0.",  ".5",    "e+",   "[1",    "],",  "cat",   "dog",    "ca",   "do",  "name",
        "age", "\":\"", "\\n",  "\\u00", "é",   "\xC3",  "\xA9",   "日本", "a\"", "}\n",
        "yes", "no",    "2024", "-01",   "T12", ":00"})
    t.push_back(s);
  t.push_back("<|special|>");
  t.push_back("<|eos|>");
  int32_t n = static_cast<int32_t>(t.size());
  return Vocabulary::Create(t, {n - 1}, {n - 2});
}

// SentencePiece style through the tokenizer.json loader: metaspace pieces and <0xNN> fallbacks.
inline std::shared_ptr<const Vocabulary> SentencePieceVocab() {
  nlohmann::json vocab = nlohmann::json::object();
  int32_t id = 0;
  vocab["<unk>"] = id++;
  vocab["<s>"] = id++;
  vocab["</s>"] = id++;
  char buf[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    vocab[buf] = id++;
  }
  for (const char* s : {"\xE2\x96\x81",
                        "\xE2\x96\x81hello",
                        "\xE2\x96\x81world",
                        "{",
                        "}",
                        "\"",
                        "\":",
                        "true",
                        "false",
                        "null",
                        "ab",
                        "abc",
                        "cat",
                        "dog",
                        "1",
                        "2",
                        "3",
                        "12",
                        "0",
                        ".",
                        "-",
                        "a",
                        "b",
                        "c",
                        "[",
                        "]",
                        ",",
                        "name",
                        "age",
                        "\xE2\x96\x81\"",
                        "\xE2\x96\x81{",
                        "yes",
                        "no",
                        "\xE6\x97\xA5"})
    if (!vocab.contains(s)) vocab[s] = id++;
  nlohmann::json tok = {
      {"model", {{"type", "BPE"}, {"byte_fallback", true}, {"vocab", vocab}}},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders", {{{"type", "Replace"}}, {{"type", "ByteFallback"}}, {{"type", "Fuse"}}}}}},
      {"added_tokens",
       {{{"id", 0}, {"content", "<unk>"}, {"special", true}},
        {{"id", 1}, {"content", "<s>"}, {"special", true}},
        {{"id", 2}, {"content", "</s>"}, {"special", true}}}}};
  auto v = Vocabulary::FromHfTokenizerJson(tok.dump(), {2});
  REQUIRE(v.ok());
  return v.value();
}

inline bool Bit(const std::vector<uint32_t>& mask, int32_t id) {
  return (mask[id >> 5] >> (id & 31)) & 1;
}

// For every token: the mask bit says exactly whether AcceptToken succeeds here.
inline void CheckMaskMatchesAccept(Matcher& m) {
  const Vocabulary& v = m.compiled().vocab();
  std::vector<uint32_t> mask(v.mask_words());
  m.FillNextTokenBitmask(mask.data());
  for (int32_t id = 0; id < static_cast<int32_t>(v.size()); ++id) {
    bool ok = m.AcceptToken(id);
    if (ok) m.Rollback(1);
    INFO("token " << id << " '" << v.token(id) << "' after " << m.num_steps() << " steps");
    REQUIRE(ok == Bit(mask, id));
  }
}

// Samples tokens from the mask until EOS (or max_steps), checking every mask on the way; returns
// the generated text. A grammar must let a random walk end.
inline std::string RandomWalk(Matcher& m, uint32_t seed, int max_steps, bool check = true) {
  const Vocabulary& v = m.compiled().vocab();
  std::mt19937 rng(seed);
  std::vector<uint32_t> mask(v.mask_words());
  std::string text;
  for (int step = 0; step < max_steps && !m.IsTerminated(); ++step) {
    if (check) CheckMaskMatchesAccept(m);
    m.FillNextTokenBitmask(mask.data());
    std::vector<int32_t> allowed;
    for (int32_t id = 0; id < static_cast<int32_t>(v.size()); ++id)
      if (Bit(mask, id)) allowed.push_back(id);
    REQUIRE(!allowed.empty());
    int32_t pick = allowed[rng() % allowed.size()];
    REQUIRE(m.AcceptToken(pick));
    if (!v.IsEos(pick)) text += v.token(pick);
  }
  return text;
}

// A real tokenizer.json from scripts/fetch_tokenizers.sh's cache, or "" when it is absent.
inline std::string CachedTokenizer(const std::string& name) {
  std::string dir;
  if (const char* c = std::getenv("LLM_TOKENIZER_CACHE")) {
    dir = c;
  } else if (const char* h = std::getenv("HOME")) {
    dir = std::string(h) + "/.cache/llm-server/tokenizers";
  }
  std::ifstream f(dir + "/" + name + "/tokenizer.json");
  if (!f) return "";
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace llm::grammar::testing
