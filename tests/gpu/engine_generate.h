// Whole-model GPU tests: runs the real EngineCore over prompts submitted together (continuous
// batching, chunked prefill beside decodes) and collects each request's tokens, optionally the
// top-2 logit gaps or the raw logits of every step (an observer: every row then returns its
// logits and the host samples them), and for MoE models every routing decision.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine_core.h"
#include "kernels/backend_registry.h"

namespace llm::gpu_test {

// Whether the kernel catalog offers cuda_c8 for sliding windows and sink logits. The C8 kernels
// implement both; the catalog row lists them once `gpu_tests "[c8_window]"` (which runs the
// kernels directly) has passed on a GPU (kernels/kernel_catalog.cc). Until then selection gives
// windowed and sink models cuda_fmha, and an 8-bit cache with them is refused.
inline bool CudaC8ServesWindows() {
  for (const BackendInfo& b : KernelCatalog()) {
    if (b.name == "cuda_c8") return (b.features & kFeatureSlidingWindow) != 0;
  }
  return false;
}

// Per request and step: top-1 minus top-2 logit, relative to the step's max |logit|.
using Gaps = std::map<std::string, std::vector<float>>;
// Per request and step: the raw logits the host sampled from.
using Logits = std::map<std::string, std::vector<std::vector<float>>>;
// Per request: the MoE routing decision of every (position, layer) the model computed
// (EngineCore::set_routing_observer), in (position, layer) order; prefill chunks and decode steps
// alike, so positions match between runs. A position computed again (recomputed after a
// preemption) keeps its latest decision.
using Routing = std::map<std::string, std::map<std::pair<int, int>, MoeRoutingDecision>>;

struct GenerateOptions {
  std::string device = "cuda";
  std::string kv_dtype = "auto";
  std::string force_backend;  // empty: the selection's choice
  int block_size = 16;
  int num_kv_blocks = 256;
  int max_batched_tokens = 48;  // forces chunked prefill beside decodes
  int cuda_graph_max_batch = 256;
  bool graph_warmup = true;  // ModelLoadOptions::cuda_graph_warmup
  bool overlap = true;       // EngineConfig::overlap_steps (a logits observer turns it off)
  std::string weight_dtype = "auto";
  bool fp8_fast_accumulation = true;        // ModelLoadOptions::fp8_fast_accumulation
  bool fp8_static_attention_output = true;  // ModelLoadOptions::fp8_static_attention_output
  std::string kv_scales_file;               // ModelLoadOptions::kv_scales_file
  std::string mla_kernel = "auto";          // ModelLoadOptions::mla_kernel (DeepSeek)
  std::string c8_prefill = "auto";          // ModelLoadOptions::c8_prefill
  std::string speculative_method = "none";  // EngineConfig::speculative
  int num_speculative_tokens = 3;
  std::string speculative_model;                 // the draft model's directory (method "draft")
  int steps = 64;                                // max_tokens of every request, or
  const std::vector<int>* max_tokens = nullptr;  // one per prompt
  const SamplingParams* sampling = nullptr;      // null: greedy; else seed + prompt index
  Gaps* gaps = nullptr;
  Logits* logits = nullptr;
  Routing* routing = nullptr;    // MoE models only (another model records none: the test fails)
  int tensor_parallel_size = 1;  // ModelLoadOptions::tensor_parallel_size
};

struct GenerateResult {
  std::vector<std::vector<int32_t>> tokens;  // per prompt
  std::string backend;                       // the attention backend that served
  int64_t graph_steps = 0;                   // forward passes replayed from CUDA graphs
  int64_t overlapped_steps = 0;              // steps queued before the previous one was read
  int64_t accepted_drafts = 0;               // speculative drafts accepted
  int64_t draft_tokens = 0;                  // speculative drafts verified
  int64_t steps = 0;                         // engine steps until every request finished
};

struct CollectSink : ResultSink {
  std::vector<int32_t> ids;
  bool done = false;
  void OnOutput(GenerationOutput o) override {
    ids.insert(ids.end(), o.token_ids.begin(), o.token_ids.end());
    done |= o.finished || !o.error.ok();
  }
};

inline GenerateResult Generate(const std::string& dir,
                               const std::vector<std::vector<int32_t>>& prompts,
                               const GenerateOptions& o) {
  EngineConfig cfg;
  cfg.model.model_dir = dir;
  cfg.model.device = o.device;
  cfg.model.attention_backend = o.force_backend;
  cfg.model.kv_cache_dtype = o.kv_dtype;
  cfg.model.block_size = o.block_size;
  cfg.model.num_kv_blocks = o.num_kv_blocks;
  cfg.model.cuda_graph_max_batch = o.cuda_graph_max_batch;
  cfg.model.cuda_graph_warmup = o.graph_warmup;
  cfg.model.weight_dtype = o.weight_dtype;
  cfg.model.fp8_fast_accumulation = o.fp8_fast_accumulation;
  cfg.model.fp8_static_attention_output = o.fp8_static_attention_output;
  cfg.model.kv_scales_file = o.kv_scales_file;
  cfg.model.mla_kernel = o.mla_kernel;
  cfg.model.c8_prefill = o.c8_prefill;
  cfg.model.tensor_parallel_size = o.tensor_parallel_size;
  cfg.scheduler.max_batched_tokens = o.max_batched_tokens;
  // A routing trace needs every position computed: a prefix-cache hit skips its positions' layers
  // (contexts that extend each other, as the teacher-forced checks submit, share whole blocks).
  if (o.routing != nullptr) cfg.scheduler.enable_prefix_caching = false;
  cfg.require_tokenizer = false;
  cfg.overlap_steps = o.overlap;
  cfg.speculative.method = o.speculative_method;
  cfg.speculative.num_speculative_tokens = o.num_speculative_tokens;
  cfg.speculative.draft_model_dir = o.speculative_model;
  auto core = EngineCore::Create(cfg);
  INFO(core.status().ToString());
  REQUIRE(core.ok());
  GenerateResult result;
  result.backend = (*core)->model().attention_backend_name();
  if (o.gaps || o.logits) {
    Gaps* gaps = o.gaps;
    Logits* logits = o.logits;
    (*core)->set_logits_observer([gaps, logits](const std::string& id, std::span<const float> l) {
      if (logits) (*logits)[id].emplace_back(l.begin(), l.end());
      if (!gaps) return;
      float a = -INFINITY, b = -INFINITY, m = 0.f;
      for (float x : l) {
        m = std::max(m, std::fabs(x));
        if (x > a) {
          b = a;
          a = x;
        } else if (x > b) {
          b = x;
        }
      }
      (*gaps)[id].push_back((a - b) / std::max(m, 1e-6f));
    });
  }
  if (o.routing) {
    Routing* routing = o.routing;
    const Status st = (*core)->set_routing_observer(
        [routing](const std::string& id, const MoeRoutingDecision& d) {
          (*routing)[id][{d.position, d.layer}] = d;
        });
    INFO(st.ToString());
    REQUIRE(st.ok());
  }
  std::vector<std::shared_ptr<CollectSink>> sinks;
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerationRequest r;
    r.request_id = std::to_string(i);
    r.prompt_ids = prompts[i];
    r.sampling.temperature = 0.0f;
    if (o.sampling) {
      r.sampling = *o.sampling;
      r.sampling.seed = o.sampling->seed + i;
    }
    r.stopping.max_tokens = o.max_tokens ? (*o.max_tokens)[i] : o.steps;
    r.stopping.ignore_eos = true;
    REQUIRE((*core)->Validate(&r).ok());
    sinks.push_back(std::make_shared<CollectSink>());
    (*core)->Add(std::move(r), sinks.back());
  }
  for (int guard = 0; (*core)->HasWork() && guard < 10000; ++guard) {
    (*core)->Step();
    ++result.steps;
  }
  result.graph_steps = (*core)->model().graph_steps();
  result.overlapped_steps = (*core)->num_overlapped_steps();
  result.accepted_drafts = static_cast<int64_t>((*core)->metrics()->spec_accepted_tokens.value());
  result.draft_tokens = static_cast<int64_t>((*core)->metrics()->spec_draft_tokens.value());
  for (auto& s : sinks) {
    REQUIRE(s->done);
    result.tokens.push_back(s->ids);
  }
  return result;
}

// Relative L2 distance of prompt i's first-step logits (the prompt's last row) from ref's.
inline double FirstStepDistance(const Logits& ref, const Logits& got, size_t i) {
  const auto& a = ref.at(std::to_string(i)).at(0);
  const auto& b = got.at(std::to_string(i)).at(0);
  REQUIRE(a.size() == b.size());
  double err2 = 0, ref2 = 0;
  for (size_t j = 0; j < a.size(); ++j) {
    err2 += (static_cast<double>(b[j]) - a[j]) * (b[j] - a[j]);
    ref2 += static_cast<double>(a[j]) * a[j];
  }
  return std::sqrt(err2 / ref2);
}

// Five prompts of 5, 37, 90, 1 and 20 random ids below `vocab` (the random-model tests' set:
// single-token, short, chunked-prefill lengths).
inline std::vector<std::vector<int32_t>> RandomPrompts(uint32_t seed, int vocab = 600) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int32_t>> prompts;
  for (int len : {5, 37, 90, 1, 20}) {
    std::vector<int32_t> p(len);
    for (auto& t : p) t = static_cast<int32_t>(rng() % vocab);
    prompts.push_back(p);
  }
  return prompts;
}

}  // namespace llm::gpu_test
