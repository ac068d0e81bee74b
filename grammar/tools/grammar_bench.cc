// llm-grammar-bench TOKENIZER_JSON EOS_ID [SCHEMA_FILE] [STEPS]
// Generates constrained JSON with random choices from each mask and reports the time of
// FillNextTokenBitmask in three classes: masks that filled the shared per-position token cache
// (the first visit of a position), masks computed from that cache, and copies of a recent
// state's mask (the matcher's memo). Times are the thread's CPU time.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "grammar/compiled_grammar.h"
#include "grammar/grammar.h"
#include "grammar/matcher.h"

namespace {

const char* kDefaultSchema = R"({
  "type": "object",
  "properties": {
    "id": {"type": "integer", "minimum": 0, "maximum": 100000},
    "name": {"type": "string", "maxLength": 24},
    "email": {"type": "string", "format": "email"},
    "role": {"enum": ["admin", "user", "guest"]},
    "score": {"type": "number"},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4},
    "address": {"type": "object", "properties": {
      "city": {"type": "string", "maxLength": 20}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
      "required": ["city", "zip"], "additionalProperties": false}
  },
  "required": ["id", "name", "role", "address"],
  "additionalProperties": false
})";

std::string ReadFile(const char* path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

double Ms(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

// This thread's CPU time: on a shared machine it is what the mask costs, whatever else runs.
double ThreadCpuMs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

}  // namespace

int main(int argc, char** argv) {
  namespace g = llm::grammar;
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s TOKENIZER_JSON EOS_ID [SCHEMA_FILE] [RUNS]\n", argv[0]);
    return 2;
  }
  auto vocab = g::Vocabulary::FromHfTokenizerJson(ReadFile(argv[1]), {std::stoi(argv[2])});
  if (!vocab.ok()) {
    std::fprintf(stderr, "%s\n", vocab.error().c_str());
    return 1;
  }
  std::string schema = argc > 3 && std::string(argv[3]) != "-" ? ReadFile(argv[3]) : kDefaultSchema;
  int runs = argc > 4 ? std::stoi(argv[4]) : 5;
  auto t0 = std::chrono::steady_clock::now();
  auto grammar = g::CompileJsonSchema(schema);
  if (!grammar.ok()) {
    std::fprintf(stderr, "%s\n", grammar.error().c_str());
    return 1;
  }
  auto compiled = g::CompiledGrammar::Create(grammar.value(), vocab.value());
  double compile_ms = Ms(std::chrono::steady_clock::now() - t0);
  std::printf("vocabulary %zu tokens (%s), grammar %zu positions, compiled in %.2f ms\n",
              vocab.value()->size(), vocab.value()->byte_level() ? "byte-level" : "sentencepiece",
              grammar.value()->positions().size(), compile_ms);
  std::vector<uint32_t> mask(vocab.value()->mask_words());
  std::vector<double> cold, warm, memo;
  std::mt19937 rng(1234);
  for (int run = 0; run < runs; ++run) {
    g::Matcher m(compiled);
    std::string text;
    for (int step = 0; step < 400 && !m.IsTerminated(); ++step) {
      size_t before = compiled->cached_positions();
      uint64_t hits = m.stats().memo_hits;
      double s = ThreadCpuMs();
      m.FillNextTokenBitmask(mask.data());
      double ms = ThreadCpuMs() - s;
      if (compiled->cached_positions() > before)
        cold.push_back(ms);
      else if (m.stats().memo_hits > hits)
        memo.push_back(ms);
      else
        warm.push_back(ms);
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < static_cast<int32_t>(vocab.value()->size()); ++id)
        if ((mask[id >> 5] >> (id & 31)) & 1) allowed.push_back(id);
      if (allowed.empty()) {
        std::fprintf(stderr, "dead end after: %s\n", text.c_str());
        return 1;
      }
      // Prefer longer tokens half of the time, as a model would, so runs do not crawl byte by byte.
      int32_t pick = allowed[rng() % allowed.size()];
      if (rng() % 2) {
        for (int k = 0; k < 8; ++k) {
          int32_t c = allowed[rng() % allowed.size()];
          if (vocab.value()->token(c).size() > vocab.value()->token(pick).size()) pick = c;
        }
      }
      m.AcceptToken(pick);
      if (!vocab.value()->IsEos(pick)) text += vocab.value()->token(pick);
    }
    if (run == 0) {
      std::printf("sample: %s\n",
                  nlohmann::json(text)
                      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                      .c_str());
    }
  }
  auto report = [](const char* what, std::vector<double> v) {
    if (v.empty()) return;
    std::sort(v.begin(), v.end());
    double sum = 0;
    for (double x : v) sum += x;
    std::printf("%s: %zu masks, mean %.3f ms, p50 %.3f, p99 %.3f, max %.3f\n", what, v.size(),
                sum / v.size(), v[v.size() / 2], v[std::min(v.size() - 1, v.size() * 99 / 100)],
                v.back());
  };
  report("fills the position cache", cold);
  report("computed from the cache ", warm);
  report("copied from the memo    ", memo);
  return 0;
}
