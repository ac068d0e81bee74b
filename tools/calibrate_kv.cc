// Calibrates static 8-bit KV cache scales: runs prompts through the fp32 model (chunked prefill,
// then greedy decoding) and records, per layer, the absmax of K (after RoPE, as the cache stores
// it) and of V for every KV head, or every KV head and channel. Writes the JSON file that
// `--kv-scales-file` reads (format in engine/loader/kv_cache_quant.h); the loader turns absmax
// into dequant scales (absmax / 127 for int8, / 448 for fp8).
//
//   llm-calibrate-kv --model DIR --prompts FILE --out scales.json
//                    [--granularity per_head|per_channel] [--max-new-tokens 64]
//                    [--block-size 16] [--prefill-chunk 64]
//
// FILE: .txt with one prompt per line (needs the model's tokenizer.json), or token-id JSON
// (`[[ids...], ...]`, `{"prompts": [...]}` or llm-dump's requests file).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "engine/loader/kv_cache_quant.h"
#include "engine/runtime/cpu/cpu_model_runner.h"
#include "tools/kv_tool_common.h"

namespace {

int Usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s --model DIR --prompts FILE(.txt|.json) --out scales.json "
               "[--granularity per_head|per_channel] [--max-new-tokens 64] [--block-size 16] "
               "[--prefill-chunk 64]\n",
               argv0);
  return 2;
}

constexpr char kTool[] = "llm-calibrate-kv";

}  // namespace

int main(int argc, char** argv) {
  llm::tools::Flags flags;
  if (!flags.Parse(argc, argv, {"--model", "--prompts", "--out"})) return Usage(argv[0]);
  const std::string granularity = flags.Get("--granularity", "per_head");
  if (granularity != "per_head" && granularity != "per_channel") {
    std::fprintf(stderr,
                 "llm-calibrate-kv: --granularity must be per_head or per_channel "
                 "(per-tensor scales are not offered)\n");
    return 2;
  }
  const int max_new = flags.GetInt("--max-new-tokens", 64);
  const int chunk = flags.GetInt("--prefill-chunk", 64);
  spdlog::set_level(spdlog::level::warn);

  auto prompts = llm::tools::LoadPrompts(flags.Get("--prompts"), flags.Get("--model"));
  if (!prompts.ok()) return llm::tools::Fail(kTool, prompts.status());
  int longest = 0;
  for (const auto& p : *prompts) longest = std::max<int>(longest, static_cast<int>(p.size()));

  llm::ModelLoadOptions opt;
  opt.model_dir = flags.Get("--model");
  opt.block_size = flags.GetInt("--block-size", 16);
  opt.num_kv_blocks = static_cast<int>(prompts->size()) *
                      ((longest + max_new + opt.block_size - 1) / opt.block_size + 1);
  opt.kv_cache_dtype = "auto";  // calibrate on the fp32 cache
  auto model_or = llm::LoadModel(opt);
  if (!model_or.ok()) return llm::tools::Fail(kTool, model_or.status());
  // The CPU runner over a per-head K/V architecture is the one that shows its new K and V.
  auto* model = dynamic_cast<llm::CpuModelRunner*>(model_or.value().get());
  if (model == nullptr || !model->set_kv_observer({})) {
    std::fprintf(stderr, "llm-calibrate-kv: %s is not a Llama-family model\n",
                 opt.model_dir.c_str());
    return 1;
  }
  const llm::ModelConfig& c = model->config();
  const bool per_channel = granularity == "per_channel";
  const int H = c.num_kv_heads, D = c.head_dim;
  const size_t width = static_cast<size_t>(H) * (per_channel ? D : 1);

  llm::KvAbsmax absmax;
  absmax.per_channel = per_channel;
  absmax.num_kv_heads = H;
  absmax.head_dim = D;
  absmax.k.assign(c.num_layers, std::vector<float>(width, 0.0f));
  absmax.v.assign(c.num_layers, std::vector<float>(width, 0.0f));
  int64_t observed = 0;
  model->set_kv_observer([&](int layer, int num_tokens, const float* k, const float* v) {
    if (layer == 0) observed += num_tokens;
    for (int t = 0; t < num_tokens; ++t) {
      for (int h = 0; h < H; ++h) {
        for (int i = 0; i < D; ++i) {
          const size_t at = (static_cast<size_t>(t) * H + h) * D + i;
          const size_t slot = per_channel ? static_cast<size_t>(h) * D + i : h;
          float& km = absmax.k[layer][slot];
          float& vm = absmax.v[layer][slot];
          km = std::fmax(km, std::fabs(k[at]));
          vm = std::fmax(vm, std::fabs(v[at]));
        }
      }
    }
  });

  llm::tools::SequenceRunner runner(model, opt.block_size, static_cast<int>(prompts->size()));
  std::vector<std::vector<float>> logits;
  llm::Status st = runner.Prefill(*prompts, chunk, &logits);
  if (!st.ok()) return llm::tools::Fail(kTool, st);
  for (int step = 0; step < max_new; ++step) {
    std::vector<std::vector<int32_t>> next(prompts->size());
    for (size_t s = 0; s < prompts->size(); ++s) next[s] = {llm::tools::Argmax(logits[s])};
    st = runner.Step(next, &logits);
    if (!st.ok()) return llm::tools::Fail(kTool, st);
  }
  st = llm::WriteKvAbsmaxFile(flags.Get("--out"), absmax);
  if (!st.ok()) return llm::tools::Fail(kTool, st);

  float k_max = 0.0f, v_max = 0.0f;
  for (int l = 0; l < c.num_layers; ++l) {
    for (float x : absmax.k[l]) k_max = std::max(k_max, x);
    for (float x : absmax.v[l]) v_max = std::max(v_max, x);
  }
  std::printf(
      "llm-calibrate-kv: %zu prompts, %lld tokens observed, %d layers, %s; "
      "largest |K| %.4g, |V| %.4g -> %s\n",
      prompts->size(), static_cast<long long>(observed), c.num_layers, granularity.c_str(), k_max,
      v_max, flags.Get("--out").c_str());
  return 0;
}
