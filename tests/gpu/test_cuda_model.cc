// The whole Llama-family model on the GPU (cuBLAS + fused kernels + cuda_c8 attention) against the
// CPU backend, through the real EngineCore: greedy tokens identical over 64 steps for a random
// model with a 16-bit cache, and the 8-bit caches' agreement measured against it.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <span>

#include <nlohmann/json.hpp>

#include "engine/base/dtype.h"
#include "engine/engine_core.h"
#include "engine/safetensors.h"

namespace llm {
namespace {

namespace fs = std::filesystem;

// A random bf16 Llama (or Qwen2, with q/k/v biases) with head_dim 64, in the HF layout.
std::string WriteRandomModel(const std::string& name, bool qwen2) {
  const fs::path dir = fs::temp_directory_path() / ("llm_gpu_model_" + name);
  fs::create_directories(dir);
  const int hidden = 256, heads = 4, kv_heads = 2, head_dim = 64, inter = 512, layers = 3,
            vocab = 600;
  nlohmann::json cfg = {{"architectures", {qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM"}},
                        {"hidden_size", hidden},
                        {"intermediate_size", inter},
                        {"num_hidden_layers", layers},
                        {"num_attention_heads", heads},
                        {"num_key_value_heads", kv_heads},
                        {"head_dim", head_dim},
                        {"vocab_size", vocab},
                        {"max_position_embeddings", 2048},
                        {"rms_norm_eps", 1e-5},
                        {"rope_theta", 10000.0},
                        {"tie_word_embeddings", false},
                        {"torch_dtype", "bfloat16"}};
  if (!qwen2) {
    cfg["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", 8.0},
                           {"low_freq_factor", 1.0},
                           {"high_freq_factor", 4.0},
                           {"original_max_position_embeddings", 128}};
  }
  std::ofstream(dir / "config.json") << cfg.dump();
  std::mt19937 rng(qwen2 ? 7 : 3);
  std::vector<TensorToWrite> ts;
  auto add = [&](const std::string& n, std::vector<int64_t> shape, float mean, float std) {
    TensorToWrite t{n, DType::kBF16, shape, {}};
    int64_t e = 1;
    for (int64_t d : shape) e *= d;
    t.data.resize(e * 2);
    std::normal_distribution<float> nd(mean, std);
    auto* p = reinterpret_cast<uint16_t*>(t.data.data());
    for (int64_t i = 0; i < e; ++i) p[i] = F32ToBf16(nd(rng));
    ts.push_back(std::move(t));
  };
  const int64_t q = heads * head_dim, kv = kv_heads * head_dim;
  add("model.embed_tokens.weight", {vocab, hidden}, 0, 1.0f);
  for (int l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {hidden}, 1, 0.1f);
    add(p + "post_attention_layernorm.weight", {hidden}, 1, 0.1f);
    add(p + "self_attn.q_proj.weight", {q, hidden}, 0, 0.08f);
    add(p + "self_attn.k_proj.weight", {kv, hidden}, 0, 0.08f);
    add(p + "self_attn.v_proj.weight", {kv, hidden}, 0, 0.08f);
    if (qwen2) {
      add(p + "self_attn.q_proj.bias", {q}, 0, 0.1f);
      add(p + "self_attn.k_proj.bias", {kv}, 0, 0.1f);
      add(p + "self_attn.v_proj.bias", {kv}, 0, 0.1f);
    }
    add(p + "self_attn.o_proj.weight", {hidden, q}, 0, 0.05f);
    add(p + "mlp.gate_proj.weight", {inter, hidden}, 0, 0.06f);
    add(p + "mlp.up_proj.weight", {inter, hidden}, 0, 0.06f);
    add(p + "mlp.down_proj.weight", {hidden, inter}, 0, 0.04f);
  }
  add("model.norm.weight", {hidden}, 1, 0.1f);
  // A wide head keeps the top-2 logit gaps of a random model well above bf16 rounding, so greedy
  // paths can be compared token for token.
  add("lm_head.weight", {vocab, hidden}, 0, 1.0f);
  REQUIRE(WriteSafetensors((dir / "model.safetensors").string(), ts).ok());
  return dir.string();
}

// Per request and step: top-1 minus top-2 logit, relative to the step's max |logit|.
using Gaps = std::map<std::string, std::vector<float>>;

struct Collect : ResultSink {
  std::vector<int32_t> ids;
  bool done = false;
  void OnOutput(GenerationOutput o) override {
    ids.insert(ids.end(), o.token_ids.begin(), o.token_ids.end());
    done |= o.finished || !o.error.ok();
  }
};

// Greedy tokens for each prompt, all submitted together (continuous batching, chunked prefill).
std::vector<std::vector<int32_t>> Generate(const std::string& dir, const std::string& device,
                                           const std::string& kv_dtype,
                                           const std::vector<std::vector<int32_t>>& prompts,
                                           int steps, Gaps* gaps = nullptr) {
  EngineConfig cfg;
  cfg.model.model_dir = dir;
  cfg.model.device = device;
  cfg.model.kv_cache_dtype = kv_dtype;
  cfg.model.block_size = 16;
  cfg.model.num_kv_blocks = 256;
  cfg.scheduler.max_batched_tokens = 48;  // forces chunked prefill beside decodes
  cfg.require_tokenizer = false;
  auto core = EngineCore::Create(cfg);
  INFO(core.status().ToString());
  REQUIRE(core.ok());
  if (gaps) {
    (*core)->set_logits_observer([gaps](const std::string& id, std::span<const float> l) {
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
  std::vector<std::shared_ptr<Collect>> sinks;
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerationRequest r;
    r.request_id = std::to_string(i);
    r.prompt_ids = prompts[i];
    r.sampling.temperature = 0.0f;
    r.stopping.max_tokens = steps;
    r.stopping.ignore_eos = true;
    REQUIRE((*core)->Validate(&r).ok());
    sinks.push_back(std::make_shared<Collect>());
    (*core)->Add(std::move(r), sinks.back());
  }
  for (int guard = 0; (*core)->HasWork() && guard < 10000; ++guard) (*core)->Step();
  std::vector<std::vector<int32_t>> out;
  for (auto& s : sinks) {
    REQUIRE(s->done);
    out.push_back(s->ids);
  }
  return out;
}

std::vector<std::vector<int32_t>> Prompts() {
  std::mt19937 rng(11);
  std::vector<std::vector<int32_t>> prompts;
  for (int len : {5, 37, 90, 1}) {
    std::vector<int32_t> p(len);
    for (auto& t : p) t = static_cast<int32_t>(rng() % 600);
    prompts.push_back(p);
  }
  return prompts;
}

// bf16 activations on the GPU against fp32 on the CPU differ by ~1e-3 of the logit range, so two
// correct implementations may pick different tokens where the top two logits are closer than that.
// The check: every sequence is identical until a step whose CPU top-2 gap is below kTieGap (a
// genuine near-tie), and most sequences never diverge. A real bug diverges at a clear margin.
constexpr float kTieGap = 5e-3f;

void CheckSameUpToTies(const std::string& what, const std::vector<std::vector<int32_t>>& ref,
                       const Gaps& ref_gaps, const std::vector<std::vector<int32_t>>& got,
                       double min_identical_fraction) {
  int identical = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    REQUIRE(ref[i].size() == 64);
    REQUIRE(got[i].size() == 64);
    size_t k = 0;
    while (k < 64 && got[i][k] == ref[i][k]) ++k;
    if (k == 64) {
      ++identical;
      continue;
    }
    const float gap = ref_gaps.at(std::to_string(i)).at(k);
    INFO(what << " prompt " << i << ": first divergence at step " << k << ", reference top-2 gap "
              << gap << " of max |logit|");
    CHECK(gap < kTieGap);
  }
  INFO(what << ": " << identical << " of " << ref.size() << " sequences identical over 64 steps");
  CHECK(identical >= min_identical_fraction * static_cast<double>(ref.size()));
}

TEST_CASE("GPU model matches the CPU backend over 64 greedy steps (16-bit cache)", "[gpu][model]") {
  for (bool qwen2 : {false, true}) {
    const std::string dir = WriteRandomModel(qwen2 ? "qwen2" : "llama", qwen2);
    Gaps gaps;
    const auto cpu = Generate(dir, "cpu", "auto", Prompts(), 64, &gaps);
    const auto gpu = Generate(dir, "cuda", "auto", Prompts(), 64);
    CheckSameUpToTies(qwen2 ? "qwen2 bf16" : "llama bf16", cpu, gaps, gpu, 0.5);
    fs::remove_all(dir);
  }
}

TEST_CASE("GPU 8-bit caches match the CPU C8 reference over 64 greedy steps", "[gpu][model]") {
  // Same storage definition on both sides (engine/base/quant.h), so the GPU 8-bit run tracks the
  // CPU 8-bit run; accuracy against fp32 is docs/KV_QUANT_ACCURACY.md's subject.
  const std::string dir = WriteRandomModel("llama8", false);
  for (const char* kv : {"fp8_e4m3_dynamic"}) {
    Gaps gaps;
    const auto cpu = Generate(dir, "cpu", kv, Prompts(), 64, &gaps);
    const auto gpu = Generate(dir, "cuda", kv, Prompts(), 64);
    // 8-bit rounding turns bf16-vs-fp32 differences into whole quantization steps, so near-ties
    // come sooner (H200, 2026-11-29: 1 of 4 sequences identical, every divergence at a gap under
    // 0.5%); only the near-tie rule is asserted.
    CheckSameUpToTies(kv, cpu, gaps, gpu, 0.0);
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace llm
