// llm-grammar-bench TOKENIZER_JSON EOS_ID RUNS [SCHEMA_FILE ...]
// For each JSON Schema (none given: a 7-property profile schema), generates RUNS constrained
// outputs with random choices from each mask and reports the compile time (wall and process CPU
// time: schema to CompiledGrammar, the per-position token cache built on its threads included) and
// the time of FillNextTokenBitmask: mean / p50 / p99 over all masks of the run, and in three
// classes: masks that filled a position's token cache entry on first use (only in grammars past
// the compile-time budget), masks computed from that cache, and copies of a recent state's mask
// (the matcher's memo). Mask times are the thread's CPU time. A markdown table of all schemas comes
// last.
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
// The process's CPU time: a compile's work on all of CompiledGrammar's threads.
double ProcessCpuMs() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

double ThreadCpuMs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

struct Times {
  std::vector<double> v;
  void Sort() { std::sort(v.begin(), v.end()); }
  double Mean() const {
    double sum = 0;
    for (double x : v) sum += x;
    return v.empty() ? 0 : sum / v.size();
  }
  double Pct(int p) const { return v.empty() ? 0 : v[std::min(v.size() - 1, v.size() * p / 100)]; }
};

struct SchemaResult {
  std::string name;
  size_t positions = 0;
  double compile_ms = 0, compile_cpu_ms = 0, fill_total_ms = 0;
  Times all, cold, warm, memo;
};

void Report(const char* what, Times t) {
  if (t.v.empty()) return;
  t.Sort();
  std::printf("  %s: %zu masks, mean %.3f ms, p50 %.3f, p99 %.3f, max %.3f\n", what, t.v.size(),
              t.Mean(), t.Pct(50), t.Pct(99), t.v.back());
}

// Random constrained walks through one schema; false on a compile error or a dead end.
bool RunSchema(const std::shared_ptr<const llm::grammar::Vocabulary>& vocab,
               const std::string& schema, int runs, SchemaResult* r) {
  namespace g = llm::grammar;
  auto t0 = std::chrono::steady_clock::now();
  const double cpu0 = ProcessCpuMs();
  auto grammar = g::CompileJsonSchema(schema);
  if (!grammar.ok()) {
    std::fprintf(stderr, "%s: %s\n", r->name.c_str(), grammar.error().c_str());
    return false;
  }
  auto compiled = g::CompiledGrammar::Create(grammar.value(), vocab);
  r->compile_ms = Ms(std::chrono::steady_clock::now() - t0);
  r->compile_cpu_ms = ProcessCpuMs() - cpu0;
  r->positions = grammar.value()->positions().size();
  std::vector<uint32_t> mask(vocab->mask_words());
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
      r->all.v.push_back(ms);
      if (compiled->cached_positions() > before) {
        r->cold.v.push_back(ms);
        r->fill_total_ms += ms;
      } else if (m.stats().memo_hits > hits) {
        r->memo.v.push_back(ms);
      } else {
        r->warm.v.push_back(ms);
      }
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < static_cast<int32_t>(vocab->size()); ++id)
        if ((mask[id >> 5] >> (id & 31)) & 1) allowed.push_back(id);
      if (allowed.empty()) {
        std::fprintf(stderr, "%s: dead end after: %s\n", r->name.c_str(), text.c_str());
        return false;
      }
      // Prefer longer tokens half of the time, as a model would, so runs do not crawl byte by byte.
      int32_t pick = allowed[rng() % allowed.size()];
      if (rng() % 2) {
        for (int k = 0; k < 8; ++k) {
          int32_t c = allowed[rng() % allowed.size()];
          if (vocab->token(c).size() > vocab->token(pick).size()) pick = c;
        }
      }
      m.AcceptToken(pick);
      if (!vocab->IsEos(pick)) text += vocab->token(pick);
    }
    if (run == 0) {
      std::printf("%s sample: %s\n", r->name.c_str(),
                  nlohmann::json(text)
                      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                      .c_str());
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  namespace g = llm::grammar;
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s TOKENIZER_JSON EOS_ID RUNS [SCHEMA_FILE ...]\n", argv[0]);
    return 2;
  }
  auto vocab = g::Vocabulary::FromHfTokenizerJson(ReadFile(argv[1]), {std::stoi(argv[2])});
  if (!vocab.ok()) {
    std::fprintf(stderr, "%s\n", vocab.error().c_str());
    return 1;
  }
  const int runs = std::stoi(argv[3]);
  std::printf("vocabulary %zu tokens (%s)\n", vocab.value()->size(),
              vocab.value()->byte_level() ? "byte-level" : "sentencepiece");
  std::vector<std::pair<std::string, std::string>> schemas;
  for (int i = 4; i < argc; ++i) {
    std::string name = argv[i];
    name = name.substr(name.find_last_of('/') + 1);
    schemas.emplace_back(name.substr(0, name.rfind(".json")), ReadFile(argv[i]));
  }
  if (schemas.empty()) schemas.emplace_back("profile (built in)", kDefaultSchema);
  std::vector<SchemaResult> results;
  bool ok = true;
  for (const auto& [name, text] : schemas) {
    SchemaResult r;
    r.name = name;
    if (!RunSchema(vocab.value(), text, runs, &r)) {
      ok = false;
      continue;
    }
    std::printf("%s: %zu positions, compiled in %.2f ms (CPU %.2f ms)\n", name.c_str(), r.positions,
                r.compile_ms, r.compile_cpu_ms);
    Report("every mask              ", r.all);
    Report("fills the position cache", r.cold);
    Report("computed from the cache ", r.warm);
    Report("copied from the memo    ", r.memo);
    results.push_back(std::move(r));
  }
  std::printf(
      "\n| schema | compile ms (CPU ms) | first-use cache fills (total ms) | masks | mean ms | "
      "p50 ms | p99 ms | computed p50 / p99 ms |\n|---|---|---|---|---|---|---|---|\n");
  for (SchemaResult& r : results) {
    r.all.Sort();
    r.warm.Sort();
    std::printf("| %s | %.2f (%.2f) | %zu (%.1f) | %zu | %.3f | %.3f | %.3f | %.3f / %.3f |\n",
                r.name.c_str(), r.compile_ms, r.compile_cpu_ms, r.cold.v.size(), r.fill_total_ms,
                r.all.v.size(), r.all.Mean(), r.all.Pct(50), r.all.Pct(99), r.warm.Pct(50),
                r.warm.Pct(99));
  }
  return ok ? 0 : 1;
}
