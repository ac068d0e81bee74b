// Draft-model speculation through EngineCore on tiny random checkpoints (CPU): greedy output with a
// smaller draft model (another architecture too) is exactly the output without speculation; with
// the target itself as its draft, every draft is accepted, which holds only if the draft model's
// K/V (in the target's blocks) is right through prompt chunks, catch-ups after rejections, paused
// speculation, opted-out requests, preemption and prefix-cache hits; sampled requests keep their
// distribution with the draft's q; every block comes back; a draft model with another vocabulary
// or tokenizer is refused.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "device_sampling_model.h"
#include "engine/engine_core.h"
#include "speculative_harness.h"
#include "tiny_checkpoint.h"

namespace llm {
namespace {

using namespace spec_test;

// A smaller Llama than the families' targets (one layer, hidden 16, one KV head) over the same
// 64-token vocabulary.
test::TinyCheckpoint SmallDraftLlama(int vocab = 64) {
  return test::TinyLlama(
      "llama", 4,
      {.h = 16, .heads = 2, .kv_heads = 1, .d = 8, .inter = 24, .layers = 1, .vocab = vocab});
}

void CheckSameTokens(const RunResult& plain, const RunResult& spec) {
  for (const auto& [id, sink] : plain.sinks) {
    INFO(id);
    const Sink& s = *spec.sinks.at(id);
    CHECK(s.tokens == sink->tokens);
    CHECK(s.reason == sink->reason);
    REQUIRE(s.logprobs.size() == sink->logprobs.size());
    for (size_t i = 0; i < s.logprobs.size(); ++i) {
      CHECK(s.logprobs[i] == Approx(sink->logprobs[i]).margin(1e-4));
    }
  }
}

// The draft model's proposals past draft_kv_len count as its K/V where the target accepted them:
// up to the first position whose token differs, never past the target's computed length.
TEST_CASE("AdvanceDraftKv keeps the accepted proposals only", "[speculative][draft_model]") {
  Sequence seq;
  seq.prompt_ids = {1, 2, 3};
  seq.output_ids = {4, 5, 6, 9};  // 5 and 6 were the accepted drafts, 9 the target's token
  seq.num_computed_tokens = 6;
  seq.draft_kv_len = 4;            // the draft model saw 1 2 3 4
  seq.draft_kv_ahead = {5, 6, 7};  // and wrote its proposals 5 6 7 at positions 4 5 6
  AdvanceDraftKv(&seq);
  CHECK(seq.draft_kv_len == 6);  // 7 at position 6 was rejected (the token there is 9)
  CHECK(seq.draft_kv_ahead.empty());

  seq.draft_kv_len = 4;
  seq.draft_kv_ahead = {5, 8, 6};  // the second proposal was rejected
  AdvanceDraftKv(&seq);
  CHECK(seq.draft_kv_len == 5);

  seq.draft_kv_len = 4;
  seq.num_computed_tokens = 5;  // position 5's block is not the target's yet
  seq.draft_kv_ahead = {5, 6};
  AdvanceDraftKv(&seq);
  CHECK(seq.draft_kv_len == 5);
}

TEST_CASE("greedy decoding with a draft model gives exactly the tokens without it",
          "[speculative][draft_model][engine]") {
  test::TempDir drafts("spec_draft_models");
  const std::string small = (drafts.path() / "small_llama").string();
  const std::string mla = (drafts.path() / "deepseek_v2").string();
  SmallDraftLlama().Write(small);
  test::TinyDeepseekV2(11).Write(mla);  // another architecture, another KV layout (latent)
  for (const Family& f : Families()) {
    for (const auto& [draft_name, draft_dir] :
         std::vector<std::pair<std::string, std::string>>{{"small llama", small}, {"MLA", mla}}) {
      INFO(f.name << ", draft " << draft_name);
      test::TempDir dir("spec_draft_exact");
      f.make().Write(dir.path());
      const std::vector<GenerationRequest> reqs = GreedyWorkload(31);
      auto plain_core = MakeCore(dir.path().string(), "none", 3);
      const RunResult plain = Run(*plain_core, reqs);
      auto spec_core = MakeCore(dir.path().string(), "draft", 3, 96, 0, draft_dir);
      REQUIRE(spec_core->draft_model() != nullptr);
      const RunResult spec = Run(*spec_core, reqs);
      CHECK(spec.drafts > 0);
      CHECK(spec.draft_tokens <= spec.drafts * 3);
      CheckSameTokens(plain, spec);
    }
  }
}

// The target as its own draft model: the draft's greedy proposal at each position is the
// target's argmax there as long as its K/V holds exactly the sequence's tokens, so every draft is
// accepted. Any K/V the draft model missed (a catch-up skipped, a stale position read, a block
// of another sequence) shows as a rejected draft.
TEST_CASE("a draft model equal to the target has every draft accepted",
          "[speculative][draft_model][engine]") {
  for (const Family& f : Families()) {
    for (int k : {1, 4}) {
      INFO(f.name << ", K = " << k);
      test::TempDir dir("spec_draft_self");
      f.make().Write(dir.path());
      const std::string d = dir.path().string();
      const std::vector<GenerationRequest> reqs = GreedyWorkload(41 + k);
      auto plain_core = MakeCore(d, "none", k);
      const RunResult plain = Run(*plain_core, reqs);
      auto spec_core = MakeCore(d, "draft", k, 96, 0, d);
      const RunResult spec = Run(*spec_core, reqs);
      CHECK(spec.drafts > 0);
      CHECK(spec.accepted == spec.draft_tokens);
      CheckSameTokens(plain, spec);
    }
  }
}

// Paused speculation (more requests than disable_by_batch_size) and an opted-out request decode
// without the draft model; when drafting resumes the draft model first catches up on the tokens
// it has not seen. With the target as the draft, every draft is still accepted.
TEST_CASE("a draft model catches up after speculation pauses",
          "[speculative][draft_model][engine]") {
  test::TempDir dir("spec_draft_pause");
  test::TinyLlama("llama", 12).Write(dir.path());
  const std::string d = dir.path().string();
  std::vector<GenerationRequest> reqs = GreedyWorkload(7);
  for (GenerationRequest& r : reqs) r.stopping.max_tokens = 40;
  auto plain_core = MakeCore(d, "none", 3);
  const RunResult plain = Run(*plain_core, reqs);
  auto core = MakeCore(d, "draft", 3, 96, /*disable_by_batch_size=*/3, d);
  const int baseline = core->num_free_blocks();
  std::map<std::string, std::shared_ptr<Sink>> sinks;
  for (GenerationRequest r : reqs) {
    REQUIRE(core->Validate(&r).ok());
    sinks[r.request_id] = std::make_shared<Sink>();
    core->Add(std::move(r), sinks[r.request_id]);
  }
  int drafts_while_busy = 0, drafts_after = 0, draft_tokens = 0, accepted = 0;
  for (int step = 0; core->HasWork() && step < 5000; ++step) {
    const int load = core->num_running() + core->num_waiting();
    const StepRecord rec = core->Step();
    (load > 3 ? drafts_while_busy : drafts_after) += rec.num_drafts;
    draft_tokens += rec.num_draft_tokens;
    accepted += rec.num_accepted_tokens;
  }
  CHECK(drafts_while_busy == 0);
  CHECK(drafts_after > 0);
  CHECK(accepted == draft_tokens);
  CHECK(core->num_free_blocks() == baseline);
  for (const auto& [id, sink] : plain.sinks) {
    INFO(id);
    CHECK(sinks.at(id)->tokens == sink->tokens);
  }
}

// A small KV pool (preemption by recompute), aborts, and prompts sharing a prefix (prefix-cache
// hits, whose blocks must carry the draft model's K/V too): every block comes back, the tokens
// are those without speculation, and with the target as its draft every draft is accepted.
TEST_CASE("draft-model speculation under preemption, aborts and prefix-cache hits",
          "[speculative][draft_model][engine]") {
  test::TempDir dir("spec_draft_preempt");
  test::TinyLlama("llama", 13).Write(dir.path());
  const std::string d = dir.path().string();
  std::vector<GenerationRequest> reqs = GreedyWorkload(99);
  for (GenerationRequest& r : reqs) r.stopping.max_tokens = 40;
  // Three more requests behind one 12-token prefix (three full blocks of 4).
  for (int i = 0; i < 3; ++i) {
    GenerationRequest r;
    r.request_id = "shared" + std::to_string(i);
    r.prompt_ids = {5, 9, 14, 5, 9, 14, 22, 5, 9, 14, 22, 30, static_cast<int32_t>(40 + i)};
    r.sampling.temperature = 0.0f;
    r.stopping.max_tokens = 24;
    r.stopping.ignore_eos = true;
    reqs.push_back(std::move(r));
  }
  auto plain_core = MakeCore(d, "none", 3, 20);
  const RunResult plain = Run(*plain_core, reqs, {{3, "r0"}, {9, "r2"}});
  auto core = MakeCore(d, "draft", 3, 20, 0, d);
  const RunResult res = Run(*core, reqs, {{3, "r0"}, {9, "r2"}});
  CHECK(res.drafts > 0);
  CHECK(res.accepted == res.draft_tokens);
  CHECK(res.sinks.at("r0")->reason == FinishReason::kAborted);
  CHECK(core->metrics()->preemptions.value() > 0);
  CHECK(core->metrics()->prefix_hits.value() > 0);
  for (const auto& [id, want] : plain.sinks) {
    INFO(id);
    const Sink& got = *res.sinks.at(id);
    if (got.reason == FinishReason::kAborted || want->reason == FinishReason::kAborted) continue;
    CHECK(got.tokens == want->tokens);
  }
  // The draft model's forwards are timed into the draft phase.
  const std::string text = core->metrics()->Render();
  CHECK(text.find("llm_engine_step_draft_seconds_count") != std::string::npos);
  CHECK(core->metrics()->spec_accepted_tokens.value() == res.accepted);
}

// Sampled requests end to end: the distribution of the second generated token (over many seeds)
// with a draft model is the one without speculation. The draft is another model whose q differs
// from the target's p (both pulled towards the same four tokens by the logit bias), so drafts are
// accepted and rejected, and the recovered tokens come from max(p - q, 0).
TEST_CASE("sampled decoding with a draft model keeps the token distribution",
          "[speculative][draft_model][engine]") {
  test::TempDir dir("spec_draft_sampled");
  test::TinyLlama("llama", 4).Write(dir.path() / "target");
  SmallDraftLlama().Write(dir.path() / "draft");
  const std::string target = (dir.path() / "target").string();
  const std::string draft = (dir.path() / "draft").string();
  const std::vector<int32_t> prompt = {2, 10, 11, 12, 2, 10, 11, 12};
  auto histogram = [&](const std::string& method, uint64_t seed0, RunResult* out) {
    auto core = MakeCore(target, method, 2, 400, 0, method == "draft" ? draft : "");
    *out = Run(*core, SampledWorkload(prompt, 8.0f, seed0));
    return SecondTokens(*out);
  };
  RunResult plain_run, spec_run;
  const std::map<int32_t, int> plain = histogram("none", 1, &plain_run);
  const std::map<int32_t, int> spec = histogram("draft", 100000, &spec_run);
  CHECK(spec_run.accepted > 100);
  CHECK(spec_run.accepted < spec_run.draft_tokens - 100);  // rejections too
  CheckSameDistribution(plain, spec,
                        "accepted " + std::to_string(spec_run.accepted) + " of " +
                            std::to_string(spec_run.draft_tokens));
}

// Four greedy speculating requests of different lengths (so their drafts run out at different
// proposal steps), the third with a repetition penalty where `penalty`, between four seeded
// sampled ones that opted out and run longer (the target overlaps them once the others are done).
std::vector<GenerationRequest> DeviceWorkload(bool penalty) {
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 8; ++i) {
    GenerationRequest r;
    r.request_id = "d" + std::to_string(i);
    r.prompt_ids = {3, 9, 27, 17, 51, 25, 11};
    r.prompt_ids.push_back(i + 2);
    r.stopping.ignore_eos = true;
    if (i % 2 == 0) {  // greedy, speculating, short
      r.sampling.temperature = 0.0f;
      r.stopping.max_tokens = 10 + i;
      if (i == 2 && penalty) r.sampling.repetition_penalty = 1.3f;
    } else {
      r.sampling.temperature = 0.9f;
      r.sampling.seed = 50 + i;
      r.speculative_decoding = false;
      r.stopping.max_tokens = 40;
    }
    reqs.push_back(std::move(r));
  }
  return reqs;
}

// Greedy drafts are drawn "on the device" from a job (only the token comes back), the target
// overlaps steps for the requests that opted out, whose pending tokens the draft model must not
// read, and catches up on their tokens never. With the target as its own draft every draft is
// accepted, and every token is the one without speculation.
TEST_CASE("a draft model beside device sampling and overlapped steps",
          "[speculative][draft_model][engine]") {
  test::TempDir dir("spec_draft_device");
  test::TinyLlama("llama", 14).Write(dir.path());
  const std::string d = dir.path().string();
  const std::vector<GenerationRequest> reqs = DeviceWorkload(/*penalty=*/true);
  auto plain_core = MakeDeviceSamplingCore(d, "none");
  const RunResult plain = Run(*plain_core, reqs);
  auto spec_core = MakeDeviceSamplingCore(d, "draft");
  const RunResult spec = Run(*spec_core, reqs);
  CHECK(spec.drafts > 0);
  CHECK(spec.accepted == spec.draft_tokens);
  CHECK(spec_core->num_overlapped_steps() > 0);
  CHECK(DeviceDraft(*spec_core).launches == 0);
  for (const auto& [id, sink] : plain.sinks) {
    INFO(id);
    CHECK(spec.sinks.at(id)->tokens == sink->tokens);
  }
}

// A draft model that overlaps steps queues each proposal forward behind the previous one, whose
// drafts it reads on the device as fed-back ids (Launch j + 1, then Collect j): no proposal row
// waits for the host. The greedy tokens are those without speculation and those of the
// synchronous chain; with the target as its draft, every draft is accepted, which a fed-back id
// naming another sequence's row (after a shorter sequence stopped proposing) would break.
TEST_CASE("the draft model's proposal forwards run without a host round trip between them",
          "[speculative][draft_model][engine]") {
  test::TempDir dir("spec_draft_pipelined");
  test::TinyLlama("llama", 14).Write(dir.path());
  const std::string d = dir.path().string();
  const std::vector<GenerationRequest> reqs = DeviceWorkload(/*penalty=*/false);
  auto plain_core = MakeDeviceSamplingCore(d, "none");
  const RunResult plain = Run(*plain_core, reqs);
  auto sync_core = MakeDeviceSamplingCore(d, "draft");
  const RunResult sync = Run(*sync_core, reqs);
  auto core = MakeDeviceSamplingCore(d, "draft", {.draft_overlap = true});
  const RunResult piped = Run(*core, reqs);
  CHECK(piped.drafts > 0);
  CHECK(piped.accepted == piped.draft_tokens);
  CheckSameTokens(plain, piped);
  CheckSameTokens(sync, piped);
  const test::DeviceSamplingModel& draft = DeviceDraft(*core);
  CHECK(draft.launches > 0);
  CHECK(draft.sync_drawn_rows == 0);  // every proposal row came back through Collect
  CHECK(draft.max_outstanding == 2);  // forward j + 1 launched before forward j was collected
  CHECK(draft.fed_back_ids > 0);
  CHECK(draft.moved_fed_back_ids > 0);  // a proposal step with fewer sequences than the last
  CHECK(draft.outstanding() == 0);
  CHECK(DeviceDraft(*sync_core).sync_drawn_rows > 0);
}

// A penalty counts the earlier drafts, whose values its job needs on the host: each proposal
// forward of a batch with such a request waits for the previous one's tokens (none is fed back),
// and the tokens stay those without speculation, alone and beside requests without penalties.
TEST_CASE("a draft model's proposals with penalties wait for the host's tokens",
          "[speculative][draft_model][engine]") {
  test::TempDir dir("spec_draft_penalty");
  test::TinyLlama("llama", 14).Write(dir.path());
  const std::string d = dir.path().string();
  const std::vector<GenerationRequest> mixed = DeviceWorkload(/*penalty=*/true);
  const std::vector<GenerationRequest> alone = {mixed[2]};
  REQUIRE(alone[0].sampling.repetition_penalty != 1.0f);
  for (const auto& reqs : {alone, mixed}) {
    INFO(reqs.size() << " requests");
    auto plain_core = MakeDeviceSamplingCore(d, "none");
    const RunResult plain = Run(*plain_core, reqs);
    auto core = MakeDeviceSamplingCore(d, "draft", {.draft_overlap = true});
    const RunResult piped = Run(*core, reqs);
    CHECK(piped.drafts > 0);
    CHECK(piped.accepted == piped.draft_tokens);
    CheckSameTokens(plain, piped);
    const test::DeviceSamplingModel& draft = DeviceDraft(*core);
    CHECK(draft.launches > 0);
    if (reqs.size() == 1) {
      CHECK(draft.fed_back_ids == 0);
      CHECK(draft.max_outstanding == 1);
    }
    CHECK(draft.outstanding() == 0);
  }
}

// The queued proposal forwards under preemption (a small KV pool), aborts, and a draft forward
// that fails to launch while the one before it runs, then one that fails to collect while the next
// runs: each failed Run leaves no forward launched and no sequence changed (its placeholders are
// verified exactly), every block comes back, and the tokens are those without speculation.
TEST_CASE("queued draft forwards under preemption, aborts and failures",
          "[speculative][draft_model][engine]") {
  test::TempDir dir("spec_draft_pipelined_preempt");
  test::TinyLlama("llama", 13).Write(dir.path());
  const std::string d = dir.path().string();
  std::vector<GenerationRequest> reqs = DeviceWorkload(/*penalty=*/false);
  for (GenerationRequest& r : reqs) r.stopping.max_tokens = 40;
  const std::map<int, std::string> aborts = {{4, "d0"}, {11, "d3"}};
  auto plain_core = MakeDeviceSamplingCore(d, "none", {.num_blocks = 24});
  const RunResult plain = Run(*plain_core, reqs, aborts);
  auto core = MakeDeviceSamplingCore(
      d, "draft", {.num_blocks = 24, .draft_overlap = true, .fail_launch = 1, .fail_collect = 4});
  const RunResult res = Run(*core, reqs, aborts);
  CHECK(res.drafts > 0);
  CHECK(res.sinks.at("d0")->reason == FinishReason::kAborted);
  CHECK(core->metrics()->preemptions.value() > 0);
  const test::DeviceSamplingModel& draft = DeviceDraft(*core);
  CHECK(draft.launches > draft.fail_launch);
  CHECK(draft.collects > draft.fail_collect);
  CHECK(draft.max_outstanding == 2);
  CHECK(draft.outstanding() == 0);
  for (const auto& [id, want] : plain.sinks) {
    INFO(id);
    const Sink& got = *res.sinks.at(id);
    if (got.reason == FinishReason::kAborted || want->reason == FinishReason::kAborted) continue;
    CHECK(got.tokens == want->tokens);
  }
}

// Structured outputs: each draft's row is masked by the grammar's state after the drafts before
// it, as the verification masks the target's. With the embedded tiny model (it has a tokenizer)
// as its own draft, every greedy draft is accepted, which unmasked drafts would not be; sampled
// constrained output still matches its constraint.
TEST_CASE("a draft model drafts under the grammar's mask", "[speculative][draft_model][engine]") {
  auto make = [](const std::string& method) {
    EngineConfig cfg;
    cfg.model.model_dir = LLM_TINY_MODEL_DIR;
    cfg.model.num_kv_blocks = 256;
    cfg.scheduler.max_num_seqs = 8;
    cfg.speculative.method = method;
    cfg.speculative.num_speculative_tokens = 4;
    if (method == "draft") cfg.speculative.draft_model_dir = LLM_TINY_MODEL_DIR;
    auto core = EngineCore::Create(cfg);
    REQUIRE(core.ok());
    REQUIRE(core.value()->grammar_cache() != nullptr);
    return std::move(core.value());
  };
  auto plain_core = make("none");
  std::vector<GenerationRequest> greedy, sampled;
  const std::vector<std::string> regexes = {"(abc ){6}[a-z]{1,3}", "(ab|cd){10}",
                                            "[0-9]{2}(, [0-9]{2}){5}"};
  for (size_t i = 0; i < regexes.size() * 2; ++i) {
    GenerationRequest r;
    r.request_id = "g" + std::to_string(i);
    r.prompt_ids = plain_core->tokenizer()->Encode("abc abc abc ab ab cd 12, 12, 12", true);
    r.constraint.kind = Constraint::Kind::kRegex;
    r.constraint.text = regexes[i % regexes.size()];
    r.stopping.max_tokens = 64;
    r.sampling.temperature = i < regexes.size() ? 0.0f : 1.0f;
    r.sampling.seed = 40 + i;
    (i < regexes.size() ? greedy : sampled).push_back(std::move(r));
  }
  const RunResult plain = Run(*plain_core, greedy);
  auto spec_core = make("draft");
  const RunResult spec = Run(*spec_core, greedy);
  CHECK(spec.drafts > 0);
  CHECK(spec.accepted == spec.draft_tokens);
  for (const GenerationRequest& r : greedy) {
    INFO(r.request_id);
    CHECK(spec.sinks.at(r.request_id)->tokens == plain.sinks.at(r.request_id)->tokens);
  }
  const RunResult spec_sampled = Run(*spec_core, sampled);
  for (const GenerationRequest& r : sampled) {
    INFO(r.request_id);
    const Sink& s = *spec_sampled.sinks.at(r.request_id);
    CHECK(s.reason == FinishReason::kStop);
    const std::string text = spec_core->tokenizer()->Decode(s.tokens, true);
    CHECK(std::regex_match(text, std::regex(r.constraint.text)));
  }
}

// The embedded tiny model (a real tokenizer.json, 770 ids) as the target; drafts written beside it.
TEST_CASE("a draft model with another vocabulary or tokenizer is refused",
          "[speculative][draft_model][engine]") {
  namespace fs = std::filesystem;
  auto create = [](const std::string& draft_dir) {
    EngineConfig cfg;
    cfg.model.model_dir = LLM_TINY_MODEL_DIR;
    cfg.model.num_kv_blocks = 64;
    cfg.speculative.method = "draft";
    cfg.speculative.draft_model_dir = draft_dir;
    return EngineCore::Create(cfg);
  };
  test::TempDir dir("spec_draft_refused");
  const fs::path tokenizer = fs::path(LLM_TINY_MODEL_DIR) / "tokenizer.json";
  struct Case {
    std::string name;
    int vocab;
    enum { kNone, kSame, kSwapped } tokenizer;
    std::string message;  // empty: accepted
  };
  for (const Case& c : std::vector<Case>{
           {"vocab64", 64, Case::kSame, "has vocab_size 64, the target 770"},
           {"no_tokenizer", 770, Case::kNone, "has no tokenizer.json"},
           {"swapped", 770, Case::kSwapped, "tokenizer has token 300"},
           {"same", 770, Case::kSame, ""},
       }) {
    INFO(c.name);
    const fs::path d = dir.path() / c.name;
    SmallDraftLlama(c.vocab).Write(d);
    if (c.tokenizer == Case::kSame) fs::copy_file(tokenizer, d / "tokenizer.json");
    if (c.tokenizer == Case::kSwapped) {
      // Ids 300 and 301 trade strings: the same token set, another numbering.
      nlohmann::json t = nlohmann::json::parse(std::ifstream(tokenizer));
      std::string a, b;
      for (auto& [token, id] : t["model"]["vocab"].items()) {
        if (id == 300) a = token;
        if (id == 301) b = token;
      }
      REQUIRE(!a.empty());
      REQUIRE(!b.empty());
      t["model"]["vocab"][a] = 301;
      t["model"]["vocab"][b] = 300;
      std::ofstream(d / "tokenizer.json") << t.dump();
    }
    auto core = create(d.string());
    if (c.message.empty()) {
      INFO(core.status().ToString());
      REQUIRE(core.ok());
      CHECK((*core)->draft_model() != nullptr);
      CHECK((*core)->draft_model()->num_kv_blocks() == (*core)->num_blocks());
      continue;
    }
    REQUIRE_FALSE(core.ok());
    INFO(core.status().message());
    CHECK(core.status().code() == StatusCode::kInvalidArgument);
    CHECK(core.status().message().find(c.message) != std::string::npos);
  }
}

// The KV budget holds both models: the block count from kv_cache_bytes divides it by the sum of
// both models' bytes per block.
TEST_CASE("the KV budget counts the draft model's bytes per block",
          "[speculative][draft_model][engine]") {
  test::TempDir dir("spec_draft_budget");
  test::TinyLlama("llama").Write(dir.path() / "target");
  SmallDraftLlama().Write(dir.path() / "draft");
  auto make = [&](const std::string& method) {
    EngineConfig cfg;
    cfg.model.model_dir = (dir.path() / "target").string();
    cfg.model.block_size = 4;
    cfg.model.kv_cache_bytes = 1 << 20;
    cfg.require_tokenizer = false;
    cfg.speculative.method = method;
    if (method == "draft") cfg.speculative.draft_model_dir = (dir.path() / "draft").string();
    auto core = EngineCore::Create(cfg);
    REQUIRE(core.ok());
    return std::move(core.value());
  };
  auto plain = make("none");
  auto spec = make("draft");
  const size_t target_bytes = plain->model().kv_bytes_per_block();
  const size_t draft_bytes = spec->draft_model()->kv_bytes_per_block();
  CHECK(draft_bytes > 0);
  CHECK(plain->num_blocks() == static_cast<int>((1 << 20) / target_bytes));
  CHECK(spec->num_blocks() == static_cast<int>((1 << 20) / (target_bytes + draft_bytes)));
  CHECK(spec->draft_model()->num_kv_blocks() == spec->num_blocks());
}

}  // namespace
}  // namespace llm
