// Measures what an 8-bit KV cache costs in accuracy against the unquantized cache on the same
// model: fp32 on the CPU, bf16 with --device cuda (the cache each device serves by default). The
// reference run decodes greedily for --steps steps after each prompt; each quantized mode then
// runs the same prompts twice in one batch:
//   teacher-forced: fed the reference run's tokens, so its logits at every step compare with the
//     reference logits for the same context (logit error, top-1 agreement);
//   free-running: its own greedy tokens (how long the two greedy continuations stay equal).
//
//   llm-kv-accuracy --model DIR --prompts FILE --out metrics.json [--steps 256]
//                   [--modes int8:per_head,int8:per_channel,fp8_e4m3:per_head,
//                            fp8_e4m3:per_channel,fp8_e4m3_dynamic]
//                   [--kv-scales-file scales.json] [--block-size 16] [--prefill-chunk 32]
//                   [--device cpu|cuda]
//
// A mode is DTYPE[:GRANULARITY][@SCALES_FILE]; static modes without @ use --kv-scales-file (or
// the checkpoint's scales when that is absent too).
//
// Per step (one prompt, one decode position): err_max = max_i |l_i - r_i| / max_i |r_i| and
// err_mean = mean_i |l_i - r_i| / max_i |r_i|, r the reference logits. Reported over all steps of
// all prompts: max and mean of err_max, mean of err_mean, the fraction of steps whose argmax equals
// the reference token, and for the free runs the fraction of equal tokens and the first divergence.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "tools/kv_tool_common.h"

namespace {

using json = nlohmann::json;
using Prompts = std::vector<std::vector<int32_t>>;

struct Options {
  std::string model_dir, scales_file, device = "cpu";
  int steps = 256, block_size = 16, chunk = 32;
};

struct Reference {
  std::vector<std::vector<std::vector<float>>> logits;  // [prompt][step][vocab]
  std::vector<std::vector<int32_t>> tokens;             // [prompt][step] greedy
};

llm::StatusOr<std::unique_ptr<llm::Model>> Load(const Options& o, const Prompts& prompts,
                                                const std::string& mode, int copies) {
  llm::ModelLoadOptions opt;
  opt.model_dir = o.model_dir;
  opt.device = o.device;
  opt.block_size = o.block_size;
  size_t longest = 0;
  for (const auto& p : prompts) longest = std::max(longest, p.size());
  opt.num_kv_blocks = copies * static_cast<int>(prompts.size()) *
                      static_cast<int>((longest + o.steps) / o.block_size + 2);
  const size_t at = mode.find('@');  // DTYPE[:GRANULARITY][@SCALES_FILE]
  const std::string type = mode.substr(0, at);
  const size_t colon = type.find(':');
  opt.kv_cache_dtype = type.substr(0, colon);
  if (colon != std::string::npos) opt.kv_scale_granularity = type.substr(colon + 1);
  if (opt.kv_cache_dtype == "int8" || opt.kv_cache_dtype == "fp8_e4m3") {
    opt.kv_scales_file = at != std::string::npos ? mode.substr(at + 1) : o.scales_file;
  }
  return llm::LoadModel(opt);
}

llm::StatusOr<Reference> RunReference(const Options& o, const Prompts& prompts) {
  LLM_ASSIGN_OR_RETURN(auto model, Load(o, prompts, "auto", 1));
  llm::tools::SequenceRunner runner(model.get(), o.block_size, static_cast<int>(prompts.size()));
  Reference ref;
  ref.logits.resize(prompts.size());
  ref.tokens.resize(prompts.size());
  std::vector<std::vector<float>> logits;
  LLM_RETURN_IF_ERROR(runner.Prefill(prompts, o.chunk, &logits));
  for (int step = 0; step < o.steps; ++step) {
    std::vector<std::vector<int32_t>> next(prompts.size());
    for (size_t s = 0; s < prompts.size(); ++s) {
      ref.tokens[s].push_back(llm::tools::Argmax(logits[s]));
      next[s] = {ref.tokens[s].back()};
      ref.logits[s].push_back(std::move(logits[s]));
    }
    if (step + 1 < o.steps) LLM_RETURN_IF_ERROR(runner.Step(next, &logits));
  }
  return ref;
}

llm::StatusOr<json> RunMode(const Options& o, const Prompts& prompts, const Reference& ref,
                            const std::string& mode) {
  LLM_ASSIGN_OR_RETURN(auto model, Load(o, prompts, mode, 2));
  const size_t n = prompts.size();
  llm::tools::SequenceRunner runner(model.get(), o.block_size, static_cast<int>(2 * n));
  Prompts both = prompts;  // [0, n): teacher-forced, [n, 2n): free-running
  both.insert(both.end(), prompts.begin(), prompts.end());
  std::vector<std::vector<float>> logits;
  LLM_RETURN_IF_ERROR(runner.Prefill(both, o.chunk, &logits));

  double err_max = 0.0, err_max_sum = 0.0, err_mean_sum = 0.0, flip_margin_max = 0.0;
  int64_t count = 0, top1_equal = 0, free_equal = 0;
  std::vector<int> first_div(n, o.steps);
  for (int step = 0; step < o.steps; ++step) {
    std::vector<std::vector<int32_t>> next(2 * n);
    for (size_t s = 0; s < n; ++s) {
      const std::vector<float>& r = ref.logits[s][step];
      const std::vector<float>& l = logits[s];
      double ref_abs = 0.0, dmax = 0.0, dsum = 0.0;
      for (size_t i = 0; i < r.size(); ++i) {
        ref_abs = std::max(ref_abs, static_cast<double>(std::fabs(r[i])));
        const double d = std::fabs(static_cast<double>(l[i]) - r[i]);
        dmax = std::max(dmax, d);
        dsum += d;
      }
      err_max = std::max(err_max, dmax / ref_abs);
      err_max_sum += dmax / ref_abs;
      err_mean_sum += dsum / static_cast<double>(r.size()) / ref_abs;
      ++count;
      const int32_t want = ref.tokens[s][step];
      const int32_t got = llm::tools::Argmax(l);
      if (got == want) {
        ++top1_equal;
      } else {  // how close the reference run was to choosing the same: its top-1 / got gap
        flip_margin_max = std::max(flip_margin_max, (r[want] - r[got]) / ref_abs);
      }
      const int32_t free_tok = llm::tools::Argmax(logits[n + s]);
      if (free_tok == want) ++free_equal;
      if (free_tok != want && first_div[s] == o.steps) first_div[s] = step;
      next[s] = {want};
      next[n + s] = {free_tok};
    }
    if (step + 1 < o.steps) LLM_RETURN_IF_ERROR(runner.Step(next, &logits));
  }
  json j = {{"mode", mode.substr(0, mode.find('@'))},
            {"prompts", n},
            {"steps", o.steps},
            {"logit_err_max", err_max},
            {"logit_err_max_mean", err_max_sum / static_cast<double>(count)},
            {"logit_err_mean", err_mean_sum / static_cast<double>(count)},
            {"top1_agreement", static_cast<double>(top1_equal) / static_cast<double>(count)},
            {"top1_flip_ref_margin_max", flip_margin_max},
            {"free_run_agreement", static_cast<double>(free_equal) / static_cast<double>(count)},
            {"free_run_first_divergence", first_div}};
  return j;
}

constexpr char kTool[] = "llm-kv-accuracy";

}  // namespace

int main(int argc, char** argv) {
  llm::tools::Flags flags;
  if (!flags.Parse(argc, argv, {"--model", "--prompts", "--out"})) {
    std::fprintf(
        stderr,
        "usage: %s --model DIR --prompts FILE --out metrics.json [--steps 256] "
        "[--modes M1,M2,...] [--kv-scales-file F] [--block-size 16] "
        "[--prefill-chunk 32] [--device cpu|cuda]\n  modes: auto, int8:per_head, int8:per_channel, "
        "fp8_e4m3:per_head, fp8_e4m3:per_channel, fp8_e4m3_dynamic; a static mode may "
        "end in @SCALES_FILE\n",
        argv[0]);
    return 2;
  }
  Options o;
  o.model_dir = flags.Get("--model");
  o.scales_file = flags.Get("--kv-scales-file");
  o.steps = flags.GetInt("--steps", 256);
  o.block_size = flags.GetInt("--block-size", 16);
  o.chunk = flags.GetInt("--prefill-chunk", 32);
  o.device = flags.Get("--device", "cpu");
  std::vector<std::string> modes;
  {
    std::stringstream ss(flags.Get("--modes",
                                   "int8:per_head,int8:per_channel,fp8_e4m3:per_head,"
                                   "fp8_e4m3:per_channel,fp8_e4m3_dynamic"));
    for (std::string m; std::getline(ss, m, ',');) {
      if (!m.empty()) modes.push_back(m);
    }
  }
  spdlog::set_level(spdlog::level::warn);

  auto prompts = llm::tools::LoadPrompts(flags.Get("--prompts"), o.model_dir);
  if (!prompts.ok()) return llm::tools::Fail(kTool, prompts.status());
  auto ref = RunReference(o, *prompts);
  if (!ref.ok()) return llm::tools::Fail(kTool, ref.status());

  json results = json::array();
  std::printf("%-22s %12s %12s %12s %8s %8s\n", "mode", "err_max", "err_max_avg", "err_mean",
              "top1", "free");
  for (const std::string& m : modes) {
    auto r = RunMode(o, *prompts, *ref, m);
    if (!r.ok()) return llm::tools::Fail(kTool, r.status());
    const json& j = *r;
    std::printf("%-22s %12.3e %12.3e %12.3e %7.2f%% %7.2f%%\n",
                j["mode"].get<std::string>().c_str(), j["logit_err_max"].get<double>(),
                j["logit_err_max_mean"].get<double>(), j["logit_err_mean"].get<double>(),
                100.0 * j["top1_agreement"].get<double>(),
                100.0 * j["free_run_agreement"].get<double>());
    results.push_back(j);
  }
  // How often the reference run itself nearly ties: its top-1 / top-2 gap relative to max |logit|.
  int64_t steps = 0, below_1pct = 0, below_3pct = 0;
  for (const auto& seq : ref->logits) {
    for (const std::vector<float>& l : seq) {
      std::vector<float> a(l.size());
      for (size_t i = 0; i < l.size(); ++i) a[i] = std::fabs(l[i]);
      std::vector<float> top(l);
      std::partial_sort(top.begin(), top.begin() + 2, top.end(), std::greater<float>());
      const double gap = (top[0] - top[1]) / *std::max_element(a.begin(), a.end());
      ++steps;
      below_1pct += gap < 0.01;
      below_3pct += gap < 0.03;
    }
  }
  const json gaps = {{"below_0.01", static_cast<double>(below_1pct) / static_cast<double>(steps)},
                     {"below_0.03", static_cast<double>(below_3pct) / static_cast<double>(steps)}};
  std::printf("reference top-1/top-2 gap below 1%% / 3%% of max|logit|: %.1f%% / %.1f%% of steps\n",
              100.0 * gaps["below_0.01"].get<double>(), 100.0 * gaps["below_0.03"].get<double>());
  std::ofstream(flags.Get("--out")) << json{{"model", o.model_dir},
                                            {"device", o.device},
                                            {"reference_top2_gap_fraction", gaps},
                                            {"results", results}}
                                           .dump(1)
                                    << "\n";
  return 0;
}
