// Random pre-quantized fp8 Llama checkpoints in the layouts the fixtures in tests/fixtures/models
// /fp8_* record (compressed-tensors per channel / per tensor with static input scales, ModelOpt,
// FBGEMM, and 128x128 blocks as DeepSeek-V3's `weight_scale_inv`), at sizes the CUDA kernels take
// (head_dim 64: the fixtures' head_dim 16 has no CUDA attention backend).
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/dtype.h"
#include "base/quant.h"
#include "engine/loader/safetensors.h"
#include "tests/gpu/random_llama.h"

namespace llm::gpu_test {

enum class Fp8Format { kCtChannel, kCtTensor, kModelOpt, kFbgemm, kBlock128 };

inline const char* Fp8FormatName(Fp8Format f) {
  switch (f) {
    case Fp8Format::kCtChannel:
      return "compressed-tensors channel";
    case Fp8Format::kCtTensor:
      return "compressed-tensors tensor (static input scales)";
    case Fp8Format::kModelOpt:
      return "modelopt FP8 (static input scales)";
    case Fp8Format::kFbgemm:
      return "fbgemm_fp8";
    case Fp8Format::kBlock128:
      return "fp8 128x128 blocks (weight_scale_inv)";
  }
  return "?";
}

// config.json "quantization_config" of each format, as the fixtures have it.
inline nlohmann::json Fp8QuantizationConfig(Fp8Format f) {
  using nlohmann::json;
  auto ct = [](const std::string& strategy, bool static_input) {
    json in = {{"num_bits", 8},
               {"type", "float"},
               {"strategy", static_input ? "tensor" : "token"},
               {"symmetric", true},
               {"dynamic", !static_input}};
    return json{{"quant_method", "compressed-tensors"},
                {"format", "float-quantized"},
                {"quantization_status", "compressed"},
                {"config_groups",
                 {{"group_0",
                   {{"targets", {"Linear"}},
                    {"weights",
                     {{"num_bits", 8},
                      {"type", "float"},
                      {"strategy", strategy},
                      {"symmetric", true},
                      {"dynamic", false}}},
                    {"input_activations", in}}}}},
                {"ignore", {"lm_head"}}};
  };
  switch (f) {
    case Fp8Format::kCtChannel:
      return ct("channel", false);
    case Fp8Format::kCtTensor:
      return ct("tensor", true);
    case Fp8Format::kModelOpt:
      return {{"quant_method", "modelopt"},
              {"quant_algo", "FP8"},
              {"kv_cache_quant_algo", nullptr},
              {"exclude_modules", {"lm_head"}}};
    case Fp8Format::kFbgemm:
      return {{"quant_method", "fbgemm_fp8"},
              {"activation_scale_ub", 1200.0},
              {"modules_to_not_convert", {"lm_head"}}};
    case Fp8Format::kBlock128:
      return {{"quant_method", "fp8"},
              {"fmt", "e4m3"},
              {"activation_scheme", "dynamic"},
              {"weight_block_size", {128, 128}}};
  }
  return {};
}

// A float32 tensor for a checkpoint.
inline TensorToWrite F32Tensor(const std::string& name, std::vector<int64_t> shape,
                               const std::vector<float>& v) {
  TensorToWrite t{name, DType::kF32, std::move(shape), {}};
  t.data.resize(v.size() * 4);
  std::memcpy(t.data.data(), v.data(), t.data.size());
  return t;
}

// w [rows, cols] (fp32) quantized as format f: X.weight (e4m3) and its scale tensors appended to
// ts (scales from the absmax of each tensor / row / 128x128 block, as the quantizers compute them).
inline void AddFp8Linear(std::vector<TensorToWrite>* ts, const std::string& stem, Fp8Format f,
                         int64_t rows, int64_t cols, const std::vector<float>& w,
                         float input_scale) {
  TensorToWrite q{stem + ".weight", DType::kFp8E4M3, {rows, cols}, {}};
  q.data.resize(static_cast<size_t>(rows * cols));
  auto* qb = reinterpret_cast<uint8_t*>(q.data.data());
  auto absmax = [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    float m = 0.f;
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t c = c0; c < c1; ++c) m = std::max(m, std::fabs(w[r * cols + c]));
    }
    return DynamicScale(m, kFp8E4M3Max);
  };
  auto quantize = [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1, float s) {
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t c = c0; c < c1; ++c) qb[r * cols + c] = QuantizeFp8(w[r * cols + c], s);
    }
  };
  if (f == Fp8Format::kBlock128) {
    const int64_t nr = (rows + 127) / 128, nc = (cols + 127) / 128;
    std::vector<float> s(static_cast<size_t>(nr * nc));
    for (int64_t br = 0; br < nr; ++br) {
      for (int64_t bc = 0; bc < nc; ++bc) {
        const int64_t r1 = std::min(rows, br * 128 + 128), c1 = std::min(cols, bc * 128 + 128);
        s[br * nc + bc] = absmax(br * 128, r1, bc * 128, c1);
        quantize(br * 128, r1, bc * 128, c1, s[br * nc + bc]);
      }
    }
    ts->push_back(std::move(q));
    ts->push_back(F32Tensor(stem + ".weight_scale_inv", {nr, nc}, s));
    return;
  }
  if (f == Fp8Format::kCtChannel || f == Fp8Format::kFbgemm) {
    std::vector<float> s(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      s[r] = absmax(r, r + 1, 0, cols);
      quantize(r, r + 1, 0, cols, s[r]);
    }
    ts->push_back(std::move(q));
    ts->push_back(F32Tensor(stem + ".weight_scale", {rows, 1}, s));
    return;
  }
  const float s = absmax(0, rows, 0, cols);
  quantize(0, rows, 0, cols, s);
  ts->push_back(std::move(q));
  // compressed-tensors writes [1], ModelOpt a 0-d scalar.
  const std::vector<int64_t> shape =
      f == Fp8Format::kModelOpt ? std::vector<int64_t>{} : std::vector<int64_t>{1};
  ts->push_back(F32Tensor(stem + ".weight_scale", shape, {s}));
  ts->push_back(F32Tensor(stem + ".input_scale", shape, {input_scale}));
}

// A random Llama (hidden 256, 4 heads of 64, 2 KV heads, intermediate 512, 2 layers, vocab 600)
// whose projections are stored as format f; embedding, norms and LM head stay bf16.
inline std::string WriteRandomFp8Llama(const std::string& name, Fp8Format f) {
  RandomCheckpoint ck(name, "LlamaForCausalLM", RandomShape{.layers = 2},
                      11 + static_cast<uint32_t>(f));
  ck.config()["quantization_config"] = Fp8QuantizationConfig(f);
  const RandomShape& s = ck.shape();
  // Activations after the norms are ~N(0, 1) (|x| < 6), attention outputs and SiluMul smaller:
  // 448 x 0.05 = 22.4 covers them, so a static scale of 0.05 does not saturate.
  const float input_scale = 0.05f;
  auto linear = [&](const std::string& stem, int64_t rows, int64_t cols) {
    std::normal_distribution<float> nd(0.f, 0.08f);
    std::vector<float> w(static_cast<size_t>(rows * cols));
    // Rows of different magnitude, so per-channel scales differ from the per-tensor one.
    for (int64_t r = 0; r < rows; ++r) {
      const float g = 0.5f + static_cast<float>(r % 7) / 6.f;
      for (int64_t c = 0; c < cols; ++c) w[r * cols + c] = g * nd(ck.rng());
    }
    AddFp8Linear(&ck.tensors(), stem, f, rows, cols, w, input_scale);
  };
  const int64_t q = ck.q_width(), kv = ck.kv_width();
  ck.Add("model.embed_tokens.weight", {s.vocab, s.hidden}, 0, 1.0f);
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    ck.Add(p + "input_layernorm.weight", {s.hidden}, 1, 0.1f);
    ck.Add(p + "post_attention_layernorm.weight", {s.hidden}, 1, 0.1f);
    linear(p + "self_attn.q_proj", q, s.hidden);
    linear(p + "self_attn.k_proj", kv, s.hidden);
    linear(p + "self_attn.v_proj", kv, s.hidden);
    linear(p + "self_attn.o_proj", s.hidden, q);
    linear(p + "mlp.gate_proj", s.inter, s.hidden);
    linear(p + "mlp.up_proj", s.inter, s.hidden);
    linear(p + "mlp.down_proj", s.hidden, s.inter);
  }
  ck.Add("model.norm.weight", {s.hidden}, 1, 0.1f);
  ck.Add("lm_head.weight", {s.vocab, s.hidden}, 0, 0.05f);
  return ck.Write();
}

}  // namespace llm::gpu_test
