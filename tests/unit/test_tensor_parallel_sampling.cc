// Device sampling and overlapped steps through TensorParallelModel, on CPU ranks: every rank (and
// the whole model it is compared with) wrapped in the test's DeviceSamplingModel, which samples
// "on the device" by the CUDA kernel's definition and overlaps steps as the CUDA runner does. The
// engine drives the split model and the whole model with the same greedy, seeded-sampling and
// penalised requests; the tokens must agree, every rank must have run the same sampling calls,
// and no row may have come back to the host for sampling. Regex-constrained requests on the tiny
// model check that deferred masks (SupplyMasks) reach every rank.
#include <catch2/catch.hpp>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine_core.h"
#include "engine/runtime/cpu/in_process_communicator.h"
#include "engine/runtime/tensor_parallel_model.h"
#include "tests/unit/device_sampling_model.h"
#include "tiny_checkpoint.h"

namespace llm {
namespace {

using test::DeviceSamplingModel;

ModelLoadOptions Options(const std::string& dir) {
  ModelLoadOptions o;
  o.model_dir = dir;
  o.device = "cpu";
  o.block_size = 4;
  o.num_kv_blocks = 96;
  return o;
}

struct TokenSink : ResultSink {
  std::vector<int32_t> tokens;
  bool done = false;
  bool error = false;
  void OnOutput(GenerationOutput o) override {
    tokens.insert(tokens.end(), o.token_ids.begin(), o.token_ids.end());
    if (o.finished || !o.error.ok()) done = true;
    error |= !o.error.ok();
  }
};

struct RunResult {
  std::unique_ptr<EngineCore> core;  // kept: it owns the model whose counters the test reads
  std::map<std::string, std::vector<int32_t>> tokens;
  int64_t overlapped_steps = 0;
};

// Greedy, seeded top-k / top-p sampling and a repetition penalty (device-sampled, but its steps
// do not overlap), with prompts longer than the token budget (chunked prefill beside decodes).
std::vector<GenerationRequest> Requests() {
  const std::vector<std::vector<int32_t>> prompts = {
      {3, 9, 27, 17, 51, 2, 40, 11, 5, 33, 8}, {7, 1, 60}, {12, 44, 30, 2}, {5, 5, 19, 50, 23, 8}};
  std::vector<GenerationRequest> reqs;
  for (size_t i = 0; i < prompts.size() * 2; ++i) {
    GenerationRequest r;
    r.request_id = "r" + std::to_string(i);
    r.prompt_ids = prompts[i % prompts.size()];
    r.stopping.max_tokens = 10;
    r.stopping.ignore_eos = true;
    switch (i % 4) {
      case 0:
        r.sampling.temperature = 0.0f;
        break;
      case 1:
        r.sampling.temperature = 0.9f;
        r.sampling.top_k = 8;
        r.sampling.seed = 100 + i;
        break;
      case 2:
        r.sampling.temperature = 1.2f;
        r.sampling.top_p = 0.9f;
        r.sampling.seed = 200 + i;
        break;
      default:
        r.sampling.temperature = 0.7f;
        r.sampling.repetition_penalty = 1.3f;
        r.sampling.seed = 300 + i;
        break;
    }
    reqs.push_back(std::move(r));
  }
  return reqs;
}

EngineConfig Config(const std::string& dir, bool overlap) {
  EngineConfig cfg;
  cfg.model = Options(dir);
  cfg.scheduler.max_batched_tokens = 8;
  cfg.scheduler.max_num_seqs = 8;
  cfg.require_tokenizer = false;
  cfg.overlap_steps = overlap;
  return cfg;
}

// Runs `reqs` (max_tokens each) together to the end; each must end once, without an error.
RunResult Run(const EngineConfig& cfg, std::unique_ptr<Model> model,
              const std::vector<GenerationRequest>& reqs, size_t max_tokens) {
  auto core = EngineCore::Create(cfg, std::move(model));
  INFO(core.status().ToString());
  REQUIRE(core.ok());
  std::map<std::string, std::shared_ptr<TokenSink>> sinks;
  for (GenerationRequest r : reqs) {
    REQUIRE((*core)->Validate(&r).ok());
    auto sink = std::make_shared<TokenSink>();
    sinks[r.request_id] = sink;
    (*core)->Add(std::move(r), sink);
  }
  int steps = 0;
  for (; (*core)->HasWork() && steps < 5000; ++steps) (*core)->Step();
  REQUIRE(steps < 5000);
  RunResult res;
  for (const auto& [id, sink] : sinks) {
    INFO(id);
    CHECK(sink->done);
    CHECK_FALSE(sink->error);
    if (max_tokens > 0) CHECK(sink->tokens.size() == max_tokens);
    res.tokens[id] = sink->tokens;
  }
  res.overlapped_steps = (*core)->num_overlapped_steps();
  res.core = std::move(core).value();
  return res;
}

// n CPU ranks of the checkpoint in o.model_dir, each wrapped in DeviceSamplingModel (`dev`).
std::unique_ptr<TensorParallelModel> Split(const ModelLoadOptions& o, int n, bool overlap,
                                           std::vector<const DeviceSamplingModel*>* dev) {
  auto group = std::make_unique<InProcessCommunicatorGroup>(n);
  std::vector<std::unique_ptr<Model>> ranks;
  for (int r = 0; r < n; ++r) {
    auto m = LoadTensorParallelRank(o, group->rank(r));
    INFO((m.ok() ? std::string() : m.status().message()));
    REQUIRE(m.ok());
    auto wrapped = std::make_unique<DeviceSamplingModel>(std::move(m).value(), overlap);
    dev->push_back(wrapped.get());
    ranks.push_back(std::move(wrapped));
  }
  auto split = std::make_unique<TensorParallelModel>(std::move(group), std::move(ranks));
  REQUIRE(split->start_status().ok());
  CHECK(split->samples_on_device());
  CHECK(split->supports_overlap() == overlap);
  return split;
}

TEST_CASE("TP: device sampling and overlapped steps through the ranks match the whole model",
          "[tensor_parallel]") {
  test::TempDir dir("tp_sampling");
  test::TinyLlama(
      "llama", 21,
      {.h = 32, .heads = 8, .kv_heads = 2, .d = 8, .inter = 48, .layers = 2, .vocab = 61})
      .Write(dir.path());
  const std::string d = dir.path().string();
  const bool overlap = GENERATE(false, true);
  INFO((overlap ? "overlapped steps" : "one step at a time"));

  auto loaded = LoadModel(Options(d));
  REQUIRE(loaded.ok());
  auto whole_model = std::make_unique<DeviceSamplingModel>(std::move(loaded).value(), overlap);
  const DeviceSamplingModel* whole_dev = whole_model.get();
  const RunResult whole = Run(Config(d, overlap), std::move(whole_model), Requests(), 10);
  CHECK(whole_dev->host_rows == 0);
  CHECK(whole_dev->sync_drawn_rows > 0);
  CHECK((whole_dev->launches > 0) == overlap);
  if (overlap) CHECK(whole.overlapped_steps > 0);

  for (int n : {2, 4}) {
    INFO("tensor_parallel_size " << n);
    std::vector<const DeviceSamplingModel*> dev;
    auto split = Split(Options(d), n, overlap, &dev);
    const RunResult res = Run(Config(d, overlap), std::move(split), Requests(), 10);
    for (const auto& [id, tokens] : whole.tokens) {
      INFO(id);
      CHECK(res.tokens.at(id) == tokens);
    }
    CHECK(res.overlapped_steps == whole.overlapped_steps);
    // Every rank sampled every row (none went back to the host), through the same calls.
    for (int r = 0; r < n; ++r) {
      INFO("rank " << r);
      CHECK(dev[r]->host_rows == 0);
      CHECK(dev[r]->sync_drawn_rows == whole_dev->sync_drawn_rows);
      CHECK(dev[r]->launches == whole_dev->launches);
      CHECK(dev[r]->collects == whole_dev->collects);
      CHECK(dev[r]->fed_back_ids == whole_dev->fed_back_ids);
    }
  }
}

// Constrained rows: in overlapped steps their masks are deferred (computed while the forward runs)
// and handed to every rank by SupplyMasks. The tiny model (byte-level BPE, 8 heads) at 2 ranks.
TEST_CASE("TP: constrained rows with deferred masks through the ranks match the whole model",
          "[tensor_parallel]") {
  EngineConfig cfg;
  cfg.model.model_dir = LLM_TINY_MODEL_DIR;
  cfg.model.device = "cpu";
  cfg.model.num_kv_blocks = 64;
  cfg.scheduler.max_num_seqs = 8;
  cfg.overlap_steps = true;
  std::vector<GenerationRequest> reqs;
  const std::vector<std::string> patterns = {"[a-c]{3,9}", "(yes|no)-[0-9]{2,5}", "x[0-9a-f]{4}"};
  for (size_t i = 0; i < patterns.size(); ++i) {
    GenerationRequest r;
    r.request_id = "re" + std::to_string(i);
    r.prompt_ids = {1, 50, 200, 33, 7, static_cast<int32_t>(300 + i)};
    r.sampling.temperature = i == 0 ? 0.0f : 1.0f;
    r.sampling.seed = 40 + i;
    r.stopping.max_tokens = 24;
    r.constraint = {Constraint::Kind::kRegex, patterns[i], {}};
    reqs.push_back(std::move(r));
  }
  auto loaded = LoadModel(cfg.model);
  REQUIRE(loaded.ok());
  auto whole_model = std::make_unique<DeviceSamplingModel>(std::move(loaded).value(), true);
  const DeviceSamplingModel* whole_dev = whole_model.get();
  const RunResult whole = Run(cfg, std::move(whole_model), reqs, 0);
  CHECK(whole_dev->deferred_launches > 0);
  CHECK(whole_dev->masked_rows > 0);
  CHECK(whole_dev->host_rows == 0);

  std::vector<const DeviceSamplingModel*> dev;
  auto split = Split(cfg.model, 2, true, &dev);
  const RunResult res = Run(cfg, std::move(split), reqs, 0);
  for (const auto& [id, tokens] : whole.tokens) {
    INFO(id);
    CHECK_FALSE(tokens.empty());
    CHECK(res.tokens.at(id) == tokens);
  }
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    CHECK(dev[r]->deferred_launches == whole_dev->deferred_launches);
    CHECK(dev[r]->masked_rows == whole_dev->masked_rows);
    CHECK(dev[r]->host_rows == 0);
  }
}

}  // namespace
}  // namespace llm
