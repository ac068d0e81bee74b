// gpt-oss fidelity on the GPU (issue 51, item 6): a random gpt-oss of the shape that diverged from
// transformers on the server (hidden 128, 4 layers, 4 query / 2 KV heads, head_dim 64, 8 experts
// top-2, expert intermediate 64, sliding window 16, YaRN, sinks, biases, untied embeddings, and
// GptOssConfig's vocabulary of 201088 and max_position_embeddings 131072, which sizes the CUDA
// graphs' block tables and so their split-KV decode), the CPU decoder as the reference (it gives
// transformers' tokens for gpt-oss), and the CUDA model teacher-forced along the CPU's greedy
// path: the GPU decodes greedily, and at each step where its token differs from the CPU's it is
// restarted on the CPU's prefix up to and including the CPU's token there (prefill, then decode
// on), so every one of the 64 steps is computed on the CPU's history. Per step: the largest logit
// error and the relative L2 error against the CPU's logits. Every divergence must be a logit
// near-tie (the CPU's top-1 leads the GPU's token by less than kLogitTie) or follow a routing
// difference at a router near-tie (the CPU's margin below kRoutingTie, router-logit units) at a
// position up to the one the step reads; and along the steps before any routing difference, the
// logits must stay within bf16's error. Variants change one thing at a time (window 16 vs 128,
// block size, whole prompts in one step, top-2 vs top-4, expert intermediate, hidden, head_dim,
// layers, vocabulary, max positions) and a summary table is printed per variant, so one run shows
// which of them brings the error.
//
//   build/cuda/tests/gpu_tests "[gpt_oss_fidelity]"
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine_core.h"
#include "engine/runtime/model.h"
#include "tests/gpu/engine_generate.h"
#include "tests/gpu/random_moe.h"

namespace llm {
namespace {

namespace fs = std::filesystem;

constexpr int kSteps = 64;
// A logit near-tie: the CPU's top-1 leads the GPU's token by less than this (the issue's
// criterion against transformers). The model's logits have a std of about 4 (lm_head_std 0.35 over
// hidden 128), like a real model's.
constexpr float kLogitTie = 0.5f;
// A router near-tie (router-logit units, the CPU's margin): the random router's logits have a std
// of ~11 here, and bf16's error of the hidden state moves them by ~0.3 (test_cuda_moe_archs.cc).
constexpr float kRoutingTie = 0.5f;
// bf16 weights and activations against fp32: relative L2 error of a step's logits while the
// routing has not differed yet (the other architectures stay below 0.01 at the first step,
// test_cuda_arch_logits.cc).
constexpr double kRelL2Bound = 0.05;

struct Variant {
  std::string name;
  gpu_test::GptOssShape shape;
  int block_size = 16;
  std::string moe_weight_dtype = "auto";  // ModelLoadOptions::moe_weight_dtype (CUDA)
  int max_batched_tokens = 48;            // 48: chunked prefill beside decodes
  bool one_at_a_time = false;             // the GPU runs each prompt alone (batch 1 decodes)
};

// The issue's shape: GptOssConfig's defaults but for the sizes it names.
gpu_test::GptOssShape IssueShape() {
  return {.hidden = 128,
          .layers = 4,
          .head_dim = 64,
          .window = 16,
          .experts = 8,
          .top_k = 2,
          .expert_inter = 64,
          .lm_head_std = 0.35f,
          .seed = 51,
          .vocab = 201088,
          .max_position_embeddings = 131072};
}

std::vector<std::vector<int32_t>> Prompts() {
  auto p = gpu_test::RandomPrompts(51);  // 5, 37, 90, 1 and 20 tokens
  std::mt19937 rng(151);
  p.emplace_back(150);  // a long one: many windows of 16 back
  for (auto& t : p.back()) t = static_cast<int32_t>(rng() % 600);
  return p;
}

// One prompt's path: tokens, the logits of every step, and the routing of every (position, layer).
struct Path {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
  std::map<std::pair<int, int>, MoeRoutingDecision> routing;
  // Teacher-forced GPU paths: per step, the round that computed it and whether its logits came
  // from a prefill (the first step of a restarted round) rather than a decode step.
  std::vector<int> round;
  std::vector<char> from_prefill;
};

struct Sink : ResultSink {
  std::vector<int32_t> ids;
  bool done = false;
  void OnOutput(GenerationOutput o) override {
    ids.insert(ids.end(), o.token_ids.begin(), o.token_ids.end());
    done |= o.finished || !o.error.ok();
  }
};

// An engine over one checkpoint that runs rounds of greedy requests, recording each request's
// logits and routing.
class Runner {
 public:
  Runner(const std::string& dir, const std::string& device, bool graphs, bool routing,
         int block_size, const std::string& moe_weight_dtype = "auto",
         int max_batched_tokens = 48) {
    EngineConfig cfg;
    cfg.model.moe_weight_dtype = moe_weight_dtype;
    cfg.model.model_dir = dir;
    cfg.model.device = device;
    cfg.model.block_size = block_size;
    cfg.model.num_kv_blocks = 4096 / block_size * 4;
    cfg.model.cuda_graph_max_batch = graphs ? 8 : 0;  // bucket 8 holds the 6 prompts
    cfg.scheduler.max_batched_tokens = max_batched_tokens;
    cfg.require_tokenizer = false;
    auto core = EngineCore::Create(cfg);
    INFO(core.status().ToString());
    REQUIRE(core.ok());
    core_ = std::move(core).value();
    core_->set_logits_observer([this](const std::string& id, std::span<const float> l) {
      logits_[id].emplace_back(l.begin(), l.end());
    });
    if (routing) {
      const Status st =
          core_->set_routing_observer([this](const std::string& id, const MoeRoutingDecision& d) {
            routing_[id][{d.position, d.layer}] = d;
          });
      INFO(st.ToString());
      REQUIRE(st.ok());
    }
  }
  std::string backend() const { return core_->model().attention_backend_name(); }
  int64_t graph_steps() const { return core_->model().graph_steps(); }

  // Runs the prompts together, each for its max_tokens greedy steps; returns their paths.
  std::vector<Path> Round(const std::vector<std::vector<int32_t>>& prompts,
                          const std::vector<int>& max_tokens) {
    std::vector<std::shared_ptr<Sink>> sinks;
    std::vector<std::string> ids;
    for (size_t i = 0; i < prompts.size(); ++i) {
      GenerationRequest r;
      r.request_id = "r" + std::to_string(next_id_++);
      r.prompt_ids = prompts[i];
      r.sampling.temperature = 0.0f;
      r.stopping.max_tokens = max_tokens[i];
      r.stopping.ignore_eos = true;
      REQUIRE(core_->Validate(&r).ok());
      ids.push_back(r.request_id);
      sinks.push_back(std::make_shared<Sink>());
      core_->Add(std::move(r), sinks.back());
    }
    for (int guard = 0; core_->HasWork() && guard < 100000; ++guard) core_->Step();
    std::vector<Path> out(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      REQUIRE(sinks[i]->done);
      out[i].tokens = sinks[i]->ids;
      out[i].logits = std::move(logits_[ids[i]]);
      out[i].routing = std::move(routing_[ids[i]]);
      REQUIRE(out[i].logits.size() == out[i].tokens.size());
    }
    return out;
  }

 private:
  std::unique_ptr<EngineCore> core_;
  std::map<std::string, std::vector<std::vector<float>>> logits_;
  std::map<std::string, std::map<std::pair<int, int>, MoeRoutingDecision>> routing_;
  int next_id_ = 0;
};

// The GPU along the CPU's path: `got[i].logits[k]` computed on the CPU's tokens before step k;
// `got[i].tokens[k]` the GPU's greedy choice there; routing of every position on the path (the
// latest computation of each). Rounds restart each diverged prompt after its divergence.
std::vector<Path> TeacherForced(Runner& gpu, const std::vector<std::vector<int32_t>>& prompts,
                                const std::vector<Path>& cpu) {
  const size_t n = prompts.size();
  std::vector<Path> got(n);
  std::vector<int> start(n, 0);  // the first step not yet computed on the CPU's path
  for (auto& g : got) {
    g.tokens.assign(kSteps, -1);
    g.logits.resize(kSteps);
    g.round.assign(kSteps, -1);
    g.from_prefill.assign(kSteps, 0);
  }
  for (int round = 0; round < kSteps; ++round) {
    std::vector<size_t> active;
    std::vector<std::vector<int32_t>> ps;
    std::vector<int> max_tokens;
    for (size_t i = 0; i < n; ++i) {
      if (start[i] >= kSteps) continue;
      active.push_back(i);
      ps.push_back(prompts[i]);
      ps.back().insert(ps.back().end(), cpu[i].tokens.begin(), cpu[i].tokens.begin() + start[i]);
      max_tokens.push_back(kSteps - start[i]);
    }
    if (active.empty()) break;
    const std::vector<Path> r = gpu.Round(ps, max_tokens);
    for (size_t a = 0; a < active.size(); ++a) {
      const size_t i = active[a];
      for (const auto& [key, d] : r[a].routing) got[i].routing[key] = d;
      int k = start[i];
      for (size_t s = 0; s < r[a].tokens.size(); ++s, ++k) {
        got[i].tokens[k] = r[a].tokens[s];
        got[i].logits[k] = r[a].logits[s];
        got[i].round[k] = round;
        got[i].from_prefill[k] = s == 0;
        if (r[a].tokens[s] != cpu[i].tokens[k]) {
          ++k;
          break;
        }
      }
      start[i] = k;
    }
  }
  return got;
}

struct StepError {
  float max_abs = 0;
  double rel_l2 = 0;
};

StepError Compare(const std::vector<float>& ref, const std::vector<float>& got) {
  REQUIRE(ref.size() == got.size());
  StepError e;
  double err2 = 0, ref2 = 0;
  for (size_t j = 0; j < ref.size(); ++j) {
    const double d = static_cast<double>(got[j]) - ref[j];
    e.max_abs = std::max(e.max_abs, static_cast<float>(std::fabs(d)));
    err2 += d * d;
    ref2 += static_cast<double>(ref[j]) * ref[j];
  }
  e.rel_l2 = std::sqrt(err2 / std::max(ref2, 1e-30));
  return e;
}

// The first position up to `last` where the GPU chose other experts than the CPU (any layer), and
// the smallest CPU margin among the differences up to `last` (INFINITY if none).
int FirstRoutingDifference(const Path& cpu, const Path& gpu, int last, float* min_margin,
                           bool* at_tie) {
  int first = -1;
  *min_margin = INFINITY;
  *at_tie = false;
  for (const auto& [key, d] : cpu.routing) {
    if (key.first > last) break;
    const auto it = gpu.routing.find(key);
    if (it == gpu.routing.end() || it->second.experts == d.experts) continue;
    if (first < 0) first = key.first;
    *min_margin = std::min(*min_margin, d.margin);
    *at_tie |= d.margin < kRoutingTie;
  }
  return first;
}

struct Summary {
  int divergences = 0, unexplained = 0, routing_steps = 0;
  float worst_abs = 0;      // steps before any routing difference
  double worst_rel = 0;     // the same
  float worst_abs_all = 0;  // every step
};

// Checks and prints one GPU run along the CPU's path. `routing_from`: the run whose routing
// explains divergences (a graph run records none; it follows the same path as the eager run).
Summary CheckAlongPath(const std::string& what, const std::vector<std::vector<int32_t>>& prompts,
                       const std::vector<Path>& cpu, const std::vector<Path>& got,
                       const std::vector<Path>& routing_from) {
  Summary sum;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const int len = static_cast<int>(prompts[i].size());
    float p_abs = 0, p_abs_clean = 0;
    double p_rel_clean = 0;
    int first_div = -1, clean_steps = 0;
    for (int k = 0; k < kSteps; ++k) {
      const StepError e = Compare(cpu[i].logits[k], got[i].logits[k]);
      const int last = len - 1 + k;  // the position step k's logits come from
      float min_margin = INFINITY;
      bool routing_tie = false;
      const int flip =
          FirstRoutingDifference(cpu[i], routing_from[i], last, &min_margin, &routing_tie);
      p_abs = std::max(p_abs, e.max_abs);
      if (e.rel_l2 > 0.1) {
        std::printf("  %s prompt %zu step %d: spike rel L2 %.4f max %.3f (round %d, %s)%s\n",
                    what.c_str(), i, k, e.rel_l2, e.max_abs, got[i].round[k],
                    got[i].from_prefill[k] ? "prefill logits" : "decode logits",
                    flip < 0 ? "" : " after a routing difference");
      }
      if (flip < 0) {
        ++clean_steps;
        p_abs_clean = std::max(p_abs_clean, e.max_abs);
        p_rel_clean = std::max(p_rel_clean, e.rel_l2);
      } else {
        ++sum.routing_steps;
      }
      const int32_t c = cpu[i].tokens[k], g = got[i].tokens[k];
      if (g == c) continue;
      ++sum.divergences;
      if (first_div < 0) first_div = k;
      const auto& ref = cpu[i].logits[k];
      const float margin = ref[c] - ref[g];
      const bool tie = margin < kLogitTie;
      const bool explained = tie || routing_tie;
      sum.unexplained += !explained;
      std::printf(
          "  %s prompt %zu (len %d) step %d: GPU %d, CPU %d; CPU top-1 leads the GPU's token by "
          "%.3f (GPU: %.3f); step max |logit error| %.3f, rel L2 %.4f; first routing difference "
          "at position %d (smallest CPU router margin %.3f)%s\n",
          what.c_str(), i, len, k, g, c, margin, got[i].logits[k][c] - got[i].logits[k][g],
          e.max_abs, e.rel_l2, flip, min_margin,
          explained ? (tie ? " [logit near-tie]" : " [routing near-tie]") : " [UNEXPLAINED]");
      INFO(what << " prompt " << i << " step " << k << ": CPU top-1 " << c << " leads the GPU's "
                << g << " by " << margin << ", routing difference at " << flip
                << " with CPU margin " << min_margin);
      CHECK(explained);
    }
    std::printf(
        "  %s prompt %zu (len %d): first divergence at step %d; max |logit error| %.4f over all "
        "steps, %.4f (rel L2 %.4f) over the %d steps before any routing difference\n",
        what.c_str(), i, len, first_div, p_abs, p_abs_clean, p_rel_clean, clean_steps);
    sum.worst_abs = std::max(sum.worst_abs, p_abs_clean);
    sum.worst_rel = std::max(sum.worst_rel, p_rel_clean);
    sum.worst_abs_all = std::max(sum.worst_abs_all, p_abs);
  }
  INFO(what << ": worst relative L2 error of the logits before any routing difference "
            << sum.worst_rel);
  CHECK(sum.worst_rel < kRelL2Bound);
  return sum;
}

// One variant: the CPU reference, then the GPU teacher-forced, eager (routing recorded) and from
// CUDA graphs (the decode steps as the server runs them).
void RunVariant(const Variant& v, std::vector<std::string>* table) {
  INFO("variant " << v.name);
  const std::string dir =
      gpu_test::WriteRandomMoe("oss_fid_" + v.name, gpu_test::RandomMoeArch::kGptOss, v.shape);
  const auto prompts = Prompts();
  std::vector<Path> cpu;
  {
    Runner r(dir, "cpu", false, true, v.block_size);
    cpu = r.Round(prompts, std::vector<int>(prompts.size(), kSteps));
  }
  Summary eager, graphs;
  std::vector<Path> eager_path;
  std::string backend;
  {
    Runner r(dir, "cuda", false, true, v.block_size, v.moe_weight_dtype, v.max_batched_tokens);
    backend = r.backend();
    if (v.one_at_a_time) {
      for (size_t i = 0; i < prompts.size(); ++i) {
        eager_path.push_back(TeacherForced(r, {prompts[i]}, {cpu[i]})[0]);
      }
    } else {
      eager_path = TeacherForced(r, prompts, cpu);
    }
    eager = CheckAlongPath(v.name + " eager", prompts, cpu, eager_path, eager_path);
  }
  {
    Runner r(dir, "cuda", true, false, v.block_size, v.moe_weight_dtype, v.max_batched_tokens);
    const auto graph_path = TeacherForced(r, prompts, cpu);
    CHECK(r.graph_steps() > 0);
    graphs = CheckAlongPath(v.name + " graphs", prompts, cpu, graph_path, eager_path);
  }
  char line[512];
  std::snprintf(line, sizeof(line),
                "%-14s %-9s | eager: %2d div, %d unexplained, max|err| %.3f clean / %.3f all, "
                "rel %.4f | graphs: %2d div, %d unexplained, max|err| %.3f / %.3f, rel %.4f",
                v.name.c_str(), backend.c_str(), eager.divergences, eager.unexplained,
                eager.worst_abs, eager.worst_abs_all, eager.worst_rel, graphs.divergences,
                graphs.unexplained, graphs.worst_abs, graphs.worst_abs_all, graphs.worst_rel);
  table->push_back(line);
  std::printf("gpt_oss_fidelity %s\n", line);
  fs::remove_all(dir);
}

void PrintTable(const std::vector<std::string>& table) {
  std::printf(
      "gpt_oss_fidelity summary (max|err|: largest logit error before any routing "
      "difference / over every step; rel: worst relative L2 before any routing "
      "difference):\n");
  for (const auto& l : table) std::printf("  %s\n", l.c_str());
}

// Known to fail (issue 51, docs/log/gpt_oss_gpu_fidelity.md): deterministic single-step spikes
// with no routing difference; [!mayfail] reports them without failing a whole gpu_tests run.
TEST_CASE("GPU gpt-oss at the issue-51 shape follows the CPU decoder teacher-forced",
          "[gpu][model][moe][gpt_oss_fidelity][!mayfail]") {
  std::vector<std::string> table;
  RunVariant({"issue", IssueShape()}, &table);
  Variant alone{"one_at_a_time", IssueShape()};  // batch-1 decodes: no other rows in a step
  alone.one_at_a_time = true;
  RunVariant(alone, &table);
  PrintTable(table);
}

// The issue's shape with the experts stored as MXFP4 (as gpt-oss checkpoints are): the CPU
// dequantizes them; the GPU keeps them for the MXFP4 grouped GEMMs (moe_weight_dtype mxfp4: the
// load fails unless it does), and dequantized to bf16 for comparison. Both GPU forms compute on
// the same weight values (e2m1 times a power of two is exact in bf16).
TEST_CASE("GPU gpt-oss with MXFP4 experts kept as stored follows the CPU decoder teacher-forced",
          "[gpu][model][moe][mxfp4][gpt_oss_fidelity][!mayfail]") {
  gpu_test::GptOssShape s = IssueShape();
  s.mxfp4 = true;
  std::vector<std::string> table;
  RunVariant({"mxfp4_kept", s, 16, "mxfp4"}, &table);
  RunVariant({"mxfp4_bf16", s, 16, "bf16"}, &table);
  PrintTable(table);
}

// moe_weight_dtype mxfp4 is refused by name where nothing keeps MXFP4 experts.
TEST_CASE("moe_weight_dtype mxfp4 fails the load of a bf16 gpt-oss checkpoint by name",
          "[gpu][moe][mxfp4]") {
  const std::string dir =
      gpu_test::WriteRandomMoe("oss_mx_refuse", gpu_test::RandomMoeArch::kGptOss, IssueShape());
  ModelLoadOptions o;
  o.model_dir = dir;
  o.device = "cuda";
  o.num_kv_blocks = 64;
  o.moe_weight_dtype = "mxfp4";
  auto model = LoadModel(o);
  REQUIRE_FALSE(model.ok());
  INFO(model.status().ToString());
  CHECK(model.status().ToString().find("moe_weight_dtype mxfp4") != std::string::npos);
  CHECK(model.status().ToString().find("not stored as MXFP4") != std::string::npos);
  fs::remove_all(dir);
}

// One change at a time from the issue's shape, and the whole-model test's shape
// (test_cuda_moe_archs.cc, which passes) with the same logit scale.
TEST_CASE("GPU gpt-oss fidelity variants isolate the issue-51 shape's differences",
          "[gpu][model][moe][gpt_oss_fidelity][gpt_oss_fidelity_variants][!mayfail]") {
  std::vector<Variant> variants;
  auto add = [&](const std::string& name, auto change, int block_size = 16) {
    gpu_test::GptOssShape s = IssueShape();
    change(s);
    variants.push_back({name, s, block_size});
  };
  add("window128", [](auto& s) { s.window = 128; });
  add("window32", [](auto& s) { s.window = 32; });
  add(
      "block32", [](auto&) {}, 32);
  variants.push_back({"whole_prompts", IssueShape(), 16, "auto", 4096});  // one prefill step
  add("top4", [](auto& s) { s.top_k = 4; });
  add("inter256", [](auto& s) { s.expert_inter = 256; });
  add("hidden256", [](auto& s) { s.hidden = 256; });
  add("head_dim128", [](auto& s) { s.head_dim = 128; });
  add("layers3", [](auto& s) { s.layers = 3; });
  add("vocab600", [](auto& s) { s.vocab = 600; });
  add("maxpos2048", [](auto& s) { s.max_position_embeddings = 2048; });
  add("test_shape", [](auto& s) {
    s = gpu_test::GptOssShape{};
    s.lm_head_std = 0.35f;
  });
  std::vector<std::string> table;
  for (const Variant& v : variants) RunVariant(v, &table);
  PrintTable(table);
}

// The one-token prompt 3 and the 4-layer issue model's first 8 greedy tokens after it on the CPU
// (the path along which the unexplained divergence, step 4, appears).
std::vector<int32_t> Prompt3Path() {
  std::vector<int32_t> path = Prompts()[3];
  const std::string dir =
      gpu_test::WriteRandomMoe("oss_probe4", gpu_test::RandomMoeArch::kGptOss, IssueShape());
  Runner r(dir, "cpu", false, true, 16);
  const auto p = r.Round({Prompts()[3]}, {8});
  path.insert(path.end(), p[0].tokens.begin(), p[0].tokens.end());
  fs::remove_all(dir);
  return path;
}

// Probe of the unexplained divergence (prompt 3, one token, step 4): the 4-layer CPU path's tokens
// fed as prompts of growing length to models truncated to 1..4 layers (the random writer draws the
// layers first, so the first L layers are the same weights), CPU against GPU: the prefill logits
// at the last prompt position, and the next decode step's where both chose the same token.
TEST_CASE("GPU gpt-oss probe: prefill and decode errors per truncated depth",
          "[gpu][model][moe][gpt_oss_probe][!mayfail]") {
  const std::vector<int32_t> path = Prompt3Path();
  for (const int layers : {1, 2, 3, 4}) {
    gpu_test::GptOssShape shape = IssueShape();
    shape.layers = layers;
    const std::string dir = gpu_test::WriteRandomMoe("oss_probe" + std::to_string(layers),
                                                     gpu_test::RandomMoeArch::kGptOss, shape);
    Runner cpu(dir, "cpu", false, true, 16);
    Runner gpu(dir, "cuda", false, true, 16);
    for (int len = 1; len <= 8; ++len) {
      const std::vector<int32_t> prompt(path.begin(), path.begin() + len);
      const Path c = cpu.Round({prompt}, {2})[0];
      const Path g = gpu.Round({prompt}, {2})[0];
      const StepError pre = Compare(c.logits[0], g.logits[0]);
      std::printf("gpt_oss_probe layers %d position %d: prefill rel L2 %.4f max %.3f", layers,
                  len - 1, pre.rel_l2, pre.max_abs);
      if (c.tokens[0] == g.tokens[0]) {
        const StepError dec = Compare(c.logits[1], g.logits[1]);
        std::printf("; decode at %d rel L2 %.4f max %.3f", len, dec.rel_l2, dec.max_abs);
      }
      int routing_diffs = 0;
      for (const auto& [key, d] : c.routing) {
        const auto it = g.routing.find(key);
        routing_diffs += it != g.routing.end() && it->second.experts != d.experts;
      }
      std::printf("; %d routing differences\n", routing_diffs);
    }
    fs::remove_all(dir);
  }
}

// Probe 2: single-token prompts over the vocabulary on the 1-layer model: the prefill logits'
// error per token id (which tokens bring the error, and whether it follows the id's size).
TEST_CASE("GPU gpt-oss probe: one-token prompts across the vocabulary",
          "[gpu][model][moe][gpt_oss_probe2][!mayfail]") {
  const std::vector<int32_t> path = Prompt3Path();
  std::printf("gpt_oss_probe2 path:");
  for (int32_t t : path) std::printf(" %d", t);
  std::printf("\n");
  gpu_test::GptOssShape shape = IssueShape();
  shape.layers = 1;
  const std::string dir =
      gpu_test::WriteRandomMoe("oss_probe2_1", gpu_test::RandomMoeArch::kGptOss, shape);
  Runner cpu(dir, "cpu", false, true, 16);
  Runner gpu(dir, "cuda", false, true, 16);
  std::vector<int32_t> ids(path.begin(), path.end());
  std::mt19937 rng(7);
  for (int i = 0; i < 40; ++i) ids.push_back(static_cast<int32_t>(rng() % 201088));
  for (const int32_t id : ids) {
    const Path c = cpu.Round({{id}}, {1})[0];
    const Path g = gpu.Round({{id}}, {1})[0];
    const StepError e = Compare(c.logits[0], g.logits[0]);
    const auto& rc = c.routing.at({0, 0});
    const auto& rg = g.routing.at({0, 0});
    std::printf(
        "gpt_oss_probe2 token %6d: rel L2 %.4f max %.3f; experts cpu %d,%d gpu %d,%d "
        "margin %.3f\n",
        id, e.rel_l2, e.max_abs, rc.experts.size() > 0 ? rc.experts[0] : -1,
        rc.experts.size() > 1 ? rc.experts[1] : -1, rg.experts.size() > 0 ? rg.experts[0] : -1,
        rg.experts.size() > 1 ? rg.experts[1] : -1, rc.margin);
  }
  fs::remove_all(dir);
}

// Probe 3: the 1-layer model with its attention block's or its experts' output removed, on the
// 4-layer path's first five tokens and on its fifth token alone: which block brings the error.
TEST_CASE("GPU gpt-oss probe: attention or experts",
          "[gpu][model][moe][gpt_oss_probe2][!mayfail]") {
  const std::vector<int32_t> path = Prompt3Path();
  struct Case {
    const char* name;
    float attn, moe;
    int layers;
  };
  for (const Case& k : {Case{"full", 1, 1, 1}, Case{"no_moe", 1, 0, 1}, Case{"no_attn", 0, 1, 1},
                        Case{"full", 1, 1, 4}, Case{"no_moe", 1, 0, 4}, Case{"no_attn", 0, 1, 4}}) {
    gpu_test::GptOssShape shape = IssueShape();
    shape.layers = k.layers;
    shape.attn_out_scale = k.attn;
    shape.moe_out_scale = k.moe;
    const std::string dir =
        gpu_test::WriteRandomMoe("oss_probe3", gpu_test::RandomMoeArch::kGptOss, shape);
    Runner cpu(dir, "cpu", false, true, 16);
    Runner gpu(dir, "cuda", false, true, 16);
    for (int len = 1; len <= 8; ++len) {
      const std::vector<int32_t> prompt(path.begin(), path.begin() + len);
      const StepError e =
          Compare(cpu.Round({prompt}, {1})[0].logits[0], gpu.Round({prompt}, {1})[0].logits[0]);
      const std::vector<int32_t> one = {path[len - 1]};
      const StepError a =
          Compare(cpu.Round({one}, {1})[0].logits[0], gpu.Round({one}, {1})[0].logits[0]);
      std::printf(
          "gpt_oss_probe3 %-7s layers %d position %d token %6d: prefill rel L2 %.4f max "
          "%.3f; the token alone rel L2 %.4f max %.3f\n",
          k.name, k.layers, len - 1, path[len - 1], e.rel_l2, e.max_abs, a.rel_l2, a.max_abs);
    }
    fs::remove_all(dir);
  }
}

// For tools/hf_fixtures/gpt_oss_bf16_error.py: writes the issue-shape checkpoint to
// $LLM_OSS_DUMP_DIR/model, the CPU's greedy paths, and the GPU's (eager, teacher-forced) per-step
// logit errors against the CPU to $LLM_OSS_DUMP_DIR/paths.json, so that transformers' own bf16
// model can be scored along the same paths (is a spike bf16's, or ours?).
TEST_CASE("GPU gpt-oss fidelity dump for the transformers bf16 comparison", "[.][gpt_oss_dump]") {
  const char* out = std::getenv("LLM_OSS_DUMP_DIR");
  REQUIRE(out != nullptr);
  const std::string dir =
      gpu_test::WriteRandomMoe("oss_dump", gpu_test::RandomMoeArch::kGptOss, IssueShape());
  const fs::path model = fs::path(out) / "model";
  fs::create_directories(model);
  fs::copy(dir, model, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  const auto prompts = Prompts();
  std::vector<Path> cpu;
  {
    Runner r(dir, "cpu", false, true, 16);
    cpu = r.Round(prompts, std::vector<int>(prompts.size(), kSteps));
  }
  Runner g(dir, "cuda", false, true, 16);
  const std::vector<Path> got = TeacherForced(g, prompts, cpu);
  nlohmann::json j;
  for (size_t i = 0; i < prompts.size(); ++i) {
    nlohmann::json p;
    p["prompt_ids"] = prompts[i];
    p["cpu_tokens"] = cpu[i].tokens;
    p["gpu_tokens"] = got[i].tokens;
    std::vector<double> rel;
    std::vector<float> max_abs;
    for (int k = 0; k < kSteps; ++k) {
      const StepError e = Compare(cpu[i].logits[k], got[i].logits[k]);
      rel.push_back(e.rel_l2);
      max_abs.push_back(e.max_abs);
    }
    p["gpu_rel_l2"] = rel;
    p["gpu_max_abs"] = max_abs;
    j["prompts"].push_back(p);
  }
  std::ofstream(fs::path(out) / "paths.json") << j.dump();
  fs::remove_all(dir);
}

// The random checkpoint of the issue's shape loads and decodes on the CPU decoder (no GPU needed).
TEST_CASE("Random gpt-oss checkpoints of the issue-51 shape run on the CPU decoder", "[host]") {
  const std::string dir =
      gpu_test::WriteRandomMoe("oss_fid_host", gpu_test::RandomMoeArch::kGptOss, IssueShape());
  Runner r(dir, "cpu", false, true, 16);
  const auto paths = r.Round(Prompts(), std::vector<int>(Prompts().size(), 4));
  for (const Path& p : paths) {
    CHECK(p.tokens.size() == 4);
    CHECK(!p.routing.empty());
  }
  fs::remove_all(dir);
  // The MXFP4 form loads on the CPU decoder too (dequantized); moe_weight_dtype mxfp4 is refused
  // there by name.
  gpu_test::GptOssShape mx = IssueShape();
  mx.mxfp4 = true;
  const std::string mx_dir =
      gpu_test::WriteRandomMoe("oss_fid_host_mx", gpu_test::RandomMoeArch::kGptOss, mx);
  Runner mr(mx_dir, "cpu", false, true, 16);
  CHECK(mr.Round(Prompts(), std::vector<int>(Prompts().size(), 2)).size() == Prompts().size());
  ModelLoadOptions o;
  o.model_dir = mx_dir;
  o.device = "cpu";
  o.moe_weight_dtype = "mxfp4";
  auto model = LoadModel(o);
  REQUIRE_FALSE(model.ok());
  CHECK(model.status().ToString().find("moe_weight_dtype mxfp4") != std::string::npos);
  fs::remove_all(mx_dir);
}

}  // namespace
}  // namespace llm
