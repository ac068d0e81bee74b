// Overlapped steps (EngineConfig::overlap_steps): the engine queues step k + 1 before it reads
// step k's tokens, feeding them back on the device as placeholders. Driven through the synthetic
// model, whose tokens depend on the fed-back id and the position, against the same workload run
// one step at a time: every request must produce the same tokens and finish the same way, under
// chunked prefill, preemption, stop tokens, length limits, seeded sampling, and requests that
// cannot overlap (penalties, logprobs). Aborts in flight must still end each request exactly once
// and return every KV block.
#include <catch2/catch.hpp>

#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/engine_core.h"

namespace llm {
namespace {

struct RecordingSink : ResultSink {
  std::vector<int32_t> tokens;
  int finals = 0;
  int outputs_after_final = 0;
  FinishReason reason = FinishReason::kNone;
  int completion_tokens = -1;
  bool error = false;
  void OnOutput(GenerationOutput o) override {
    if (finals > 0) ++outputs_after_final;
    tokens.insert(tokens.end(), o.token_ids.begin(), o.token_ids.end());
    if (o.finished || !o.error.ok()) {
      ++finals;
      reason = o.finish_reason;
      completion_tokens = o.usage.completion_tokens;
      error = !o.error.ok();
    }
  }
};

std::unique_ptr<EngineCore> MakeCore(bool overlap) {
  EngineConfig cfg;
  // A small vocabulary makes stop tokens frequent; a small pool forces preemption.
  cfg.model.model_dir = "synthetic:vocab=40,max_len=512,device_sampling=1";
  cfg.model.block_size = 8;
  cfg.model.num_kv_blocks = 48;
  cfg.scheduler.max_num_seqs = 12;
  cfg.scheduler.max_batched_tokens = 64;
  cfg.scheduler.enable_prefix_caching = true;
  cfg.require_tokenizer = false;
  cfg.overlap_steps = overlap;
  auto core = EngineCore::Create(cfg);
  REQUIRE(core.ok());
  return std::move(core.value());
}

std::vector<GenerationRequest> Workload(uint64_t seed, int n) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < n; ++i) {
    GenerationRequest r;
    r.request_id = "r" + std::to_string(i);
    // Shared leading tokens on some prompts exercise the prefix cache.
    const int len = 1 + static_cast<int>(rng() % 50);
    for (int t = 0; t < len; ++t) {
      r.prompt_ids.push_back(i % 3 == 0 && t < 16 ? t : static_cast<int32_t>(rng() % 40));
    }
    r.stopping.max_tokens = 1 + static_cast<int>(rng() % 30);
    r.stopping.min_tokens = static_cast<int>(rng() % 3) % (r.stopping.max_tokens + 1);
    if (rng() % 2) r.stopping.stop_token_ids.push_back(static_cast<int32_t>(rng() % 40));
    // The first half overlaps freely; in the second half requests that cannot overlap mix in.
    const uint32_t kind = i < n / 2 ? rng() % 2 : rng() % 4;
    switch (kind) {
      case 0:  // seeded sampling on the device
        r.sampling.temperature = 0.8f;
        r.sampling.top_k = 5;
        r.sampling.seed = 1000 + i;
        break;
      case 2:  // penalties read the generated tokens: this request's steps cannot overlap
        r.sampling.repetition_penalty = 1.3f;
        r.sampling.temperature = 0.5f;
        r.sampling.seed = 2000 + i;
        break;
      case 3:  // logprobs: sampled on the host
        r.sampling.logprobs = 2;
        break;
      default:  // greedy
        break;
    }
    // The overlappable half goes first (lower priority value), so many steps are overlappable.
    r.priority = i < n / 2 ? static_cast<int>(rng() % 2) : 2;
    reqs.push_back(std::move(r));
  }
  return reqs;
}

struct RunResult {
  std::map<std::string, std::shared_ptr<RecordingSink>> sinks;
  int64_t overlapped_steps = 0;
};

// Runs the workload to the end; `abort_at` maps a step number to the request aborted before it.
RunResult Run(bool overlap, const std::vector<GenerationRequest>& reqs,
              const std::map<int, std::string>& abort_at = {}) {
  auto core = MakeCore(overlap);
  const int baseline = core->num_free_blocks();
  RunResult res;
  for (GenerationRequest r : reqs) {
    REQUIRE(core->Validate(&r).ok());
    auto sink = std::make_shared<RecordingSink>();
    res.sinks[r.request_id] = sink;
    core->Add(std::move(r), sink);
  }
  int step = 0;
  for (; core->HasWork() && step < 20000; ++step) {
    auto it = abort_at.find(step);
    if (it != abort_at.end()) core->Abort(it->second, Status::Ok());
    core->Step();
  }
  REQUIRE(step < 20000);
  res.overlapped_steps = core->num_overlapped_steps();
  // Resources back to baseline: every block free again (cached prefix blocks count as free).
  CHECK(core->num_free_blocks() == baseline);
  CHECK(core->num_running() == 0);
  CHECK(core->num_waiting() == 0);
  for (const auto& [id, sink] : res.sinks) {
    INFO(id);
    CHECK(sink->finals == 1);
    CHECK(sink->outputs_after_final == 0);
    if (!sink->error && sink->reason != FinishReason::kAborted) {
      CHECK(sink->completion_tokens == static_cast<int>(sink->tokens.size()));
    }
  }
  return res;
}

TEST_CASE("overlapped steps produce exactly the tokens of one-at-a-time steps", "[engine]") {
  for (uint64_t seed : {1, 2, 3}) {
    INFO("seed " << seed);
    const auto reqs = Workload(seed, 40);
    const RunResult sync = Run(false, reqs);
    const RunResult over = Run(true, reqs);
    CHECK(sync.overlapped_steps == 0);
    CHECK(over.overlapped_steps > 20);
    int stopped = 0;
    for (const auto& [id, s] : sync.sinks) {
      INFO(id);
      const auto& o = *over.sinks.at(id);
      CHECK(o.tokens == s->tokens);
      CHECK(o.reason == s->reason);
      CHECK(o.completion_tokens == s->completion_tokens);
      stopped += s->reason == FinishReason::kStop;
    }
    CHECK(stopped > 0);  // some requests ended on a stop token the host saw one step late
  }
}

TEST_CASE("aborts between overlapped steps end each request once and free its blocks", "[engine]") {
  const auto reqs = Workload(7, 30);
  const RunResult ref = Run(false, reqs);
  std::mt19937 rng(9);
  std::map<int, std::string> abort_at;
  for (int i = 0; i < 12; ++i) {
    abort_at[static_cast<int>(rng() % 60)] = "r" + std::to_string(rng() % 30);
  }
  const RunResult over = Run(true, reqs, abort_at);
  CHECK(over.overlapped_steps > 0);
  int aborted = 0;
  for (const auto& [id, s] : over.sinks) {
    INFO(id);
    const auto& want = ref.sinks.at(id)->tokens;
    // An aborted request streamed a prefix of what it would have generated; the others all of it.
    REQUIRE(s->tokens.size() <= want.size());
    CHECK(std::equal(s->tokens.begin(), s->tokens.end(), want.begin()));
    if (s->reason == FinishReason::kAborted) {
      ++aborted;
    } else {
      CHECK(s->tokens == want);
    }
  }
  CHECK(aborted > 0);
}

}  // namespace
}  // namespace llm
