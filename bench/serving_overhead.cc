// Serving-overhead benchmark: everything except the model. Runs the real EngineCore on the
// synthetic model (instant logits) with N running sequences in steady decode and reports the
// time per step spent in scheduling + batch preparation, and in sampling + streaming.
//
//   build/cpu/bench/serving_overhead [--seqs 256] [--steps 2000] [--vocab 32000]
//                                    [--prompt 128] [--block-size 64] [--device-sampling 0|1]
//                                    [--ngram K]
// --device-sampling 1: the model returns tokens as the GPU models do, so "sampling + streaming"
// is the engine's per-token work (detokenize, stop strings, metrics, streaming) alone.
// --ngram K: n-gram speculation with K drafts (the synthetic model's tokens repeat, so drafts are
// proposed and partly accepted): what a verify step costs the host (proposing, acceptance) beside
// a plain step; steps with drafts do not overlap, so this time adds to every verify step's, while
// steps without drafts overlap as without speculation ("overlapped steps").
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "engine/engine_core.h"

namespace {

struct NullSink : llm::ResultSink {
  void OnOutput(llm::GenerationOutput) override {}
};

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, int> a = {{"--seqs", 256},   {"--steps", 2000},    {"--vocab", 32000},
                                  {"--prompt", 128}, {"--block-size", 64}, {"--device-sampling", 0},
                                  {"--ngram", 0}};
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!a.count(argv[i])) {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
    a[argv[i]] = std::atoi(argv[i + 1]);
  }
  spdlog::set_level(spdlog::level::warn);
  llm::EngineConfig cfg;
  cfg.model.model_dir = "synthetic:vocab=" + std::to_string(a["--vocab"]) + ",max_len=1000000" +
                        (a["--device-sampling"] ? ",device_sampling=1" : "");
  cfg.model.block_size = a["--block-size"];
  cfg.model.num_kv_blocks = 1 << 20;
  cfg.scheduler.max_num_seqs = a["--seqs"];
  cfg.scheduler.max_batched_tokens = std::max(8192, a["--seqs"] * 2);
  cfg.max_tokens_limit = 1 << 24;
  if (a["--ngram"] > 0) {
    cfg.speculative.method = "ngram";
    cfg.speculative.num_speculative_tokens = a["--ngram"];
    cfg.speculative.disable_by_batch_size = 0;
  }
  auto core_or = llm::EngineCore::Create(cfg);
  if (!core_or.ok()) {
    std::fprintf(stderr, "%s\n", core_or.status().ToString().c_str());
    return 1;
  }
  auto& core = *core_or.value();
  auto sink = std::make_shared<NullSink>();
  for (int i = 0; i < a["--seqs"]; ++i) {
    llm::GenerationRequest r;
    r.request_id = std::to_string(i);
    for (int t = 0; t < a["--prompt"]; ++t)
      r.prompt_ids.push_back((i * 131 + t * 7) % a["--vocab"]);
    r.sampling.temperature = 0.0f;
    r.stopping.max_tokens = a["--steps"] + 16;
    r.stopping.ignore_eos = true;
    if (!core.Validate(&r).ok()) return 1;
    core.Add(std::move(r), sink);
  }
  // Warm up until every sequence is decoding.
  for (int i = 0; i < 16; ++i) core.Step();
  std::vector<double> sched, prep, fwd, samp, draft, verify;
  const int64_t overlapped_before = core.num_overlapped_steps();
  int64_t drafted = 0, accepted = 0, emitted = 0;
  for (int i = 0; i < a["--steps"]; ++i) {
    const llm::StepRecord r = core.Step();
    if (static_cast<int>(r.entries.size()) != a["--seqs"]) {
      std::fprintf(stderr, "step %d ran %zu sequences, expected %d\n", i, r.entries.size(),
                   a["--seqs"]);
      return 1;
    }
    sched.push_back(r.schedule_s * 1e3);
    prep.push_back(r.prepare_s * 1e3);
    fwd.push_back(r.forward_s * 1e3);
    samp.push_back(r.sample_s * 1e3);
    draft.push_back(r.draft_s * 1e3);
    verify.push_back(r.verify_s * 1e3);
    drafted += r.num_draft_tokens;
    accepted += r.num_accepted_tokens;
    for (const auto& e : r.entries) emitted += e.num_tokens;
  }
  std::vector<double> overhead(sched.size());
  for (size_t i = 0; i < sched.size(); ++i) overhead[i] = sched[i] + prep[i];
  std::printf(
      "serving overhead, %d running sequences, vocab %d, %d steps, %s sampling (ms per "
      "step)\n",
      a["--seqs"], a["--vocab"], a["--steps"], a["--device-sampling"] ? "device" : "host");
  std::printf("| phase                     |   p50   |   p90   |   p99   |\n");
  auto row = [](const char* name, const std::vector<double>& v) {
    std::printf("| %-25s | %7.4f | %7.4f | %7.4f |\n", name, Percentile(v, 0.5), Percentile(v, 0.9),
                Percentile(v, 0.99));
  };
  row("schedule", sched);
  row("batch preparation", prep);
  row("schedule + preparation", overhead);
  row("synthetic forward", fwd);
  row("sampling + streaming", samp);
  std::printf("overlapped steps: %lld of %d\n",
              static_cast<long long>(core.num_overlapped_steps() - overlapped_before),
              a["--steps"]);
  if (a["--ngram"] > 0) {
    row("proposing drafts", draft);
    row("verifying drafts", verify);
    std::printf("drafts: %lld proposed, %lld accepted; %.2f tokens computed per sequence-step\n",
                static_cast<long long>(drafted), static_cast<long long>(accepted),
                static_cast<double>(emitted) / (static_cast<double>(a["--steps"]) * a["--seqs"]));
  }
  return 0;
}
