// Table-driven: broken or unsupported checkpoints are refused at load with a message that names
// the problem, and nothing crashes or throws. Also: pre-quantized fp8 checkpoints load on the CPU
// with weights dequantized exactly (e4m3 value * scale), checked against the same model written
// with those dequantized values in fp32.
#include <catch2/catch.hpp>

#include <cstring>
#include <functional>

#include "base/quant.h"
#include "engine/runtime/model.h"
#include "tests/gpu/engine_generate.h"
#include "tests/unit/tiny_checkpoint.h"

namespace llm {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using test::TempDir;
using test::TinyCheckpoint;

Status TryLoad(const fs::path& dir) {
  ModelLoadOptions o;
  o.model_dir = dir.string();
  o.device = "cpu";
  o.block_size = 16;
  o.num_kv_blocks = 4;
  auto m = LoadModel(o);
  return m.ok() ? Status::Ok() : m.status();
}

struct BrokenCase {
  const char* name;
  bool deepseek;
  std::function<void(TinyCheckpoint*)> edit;             // before writing
  std::function<void(const fs::path&)> after = nullptr;  // on the written files
  const char* expect;                                    // substring of the error
};

void Truncate(const fs::path& file, uintmax_t keep_from_end) {
  fs::resize_file(file, fs::file_size(file) - keep_from_end);
}

TEST_CASE("broken checkpoints are refused with a message naming the problem",
          "[broken_checkpoint]") {
  const std::string L = "model.layers.0.";
  const std::vector<BrokenCase> cases = {
      {"missing tensor", false, [&](auto* c) { c->Remove(L + "mlp.up_proj.weight"); }, nullptr,
       "missing tensor 'model.layers.0.mlp.up_proj.weight'"},
      {"extra o_proj bias with attention_bias false", false,
       [&](auto* c) { c->AddF32(L + "self_attn.o_proj.bias", {32}, 0, 1, 1); }, nullptr,
       "self_attn.o_proj.bias"},
      {"q/k norms the architecture has not", false,
       [&](auto* c) { c->AddF32(L + "self_attn.q_norm.weight", {8}, 1, 0, 1); }, nullptr,
       "self_attn.q_norm.weight"},
      {"extra tensor in a DeepSeek checkpoint", true,
       [&](auto* c) { c->AddF32("model.extra.weight", {4}, 0, 1, 1); }, nullptr,
       "model.extra.weight"},
      {"mis-shaped tensor", false,
       [&](auto* c) {
         c->Remove("model.norm.weight");
         c->AddF32("model.norm.weight", {31}, 1, 0, 1);
       },
       nullptr, "'model.norm.weight' has shape [31], expected [32]"},
      {"wrong dtype", false, [&](auto* c) { c->Find("model.norm.weight")->dtype = DType::kI8; },
       nullptr, "model.norm.weight"},
      {"fp8 tensor without quantization_config", false,
       [&](auto* c) {
         auto* t = c->Find(L + "mlp.down_proj.weight");
         t->dtype = DType::kFp8E4M3;
         t->data.resize(t->data.size() / 4);
       },
       nullptr, "no quantization_config"},
      {"fp8 weight without its scale", false,
       [&](auto* c) {
         c->config["quantization_config"] = {{"quant_method", "fbgemm_fp8"}};
         auto* t = c->Find(L + "mlp.down_proj.weight");
         t->dtype = DType::kFp8E4M3;
         t->data.resize(t->data.size() / 4);
       },
       nullptr, "mlp.down_proj.weight_scale"},
      {"mlp_bias true without biases", false, [&](auto* c) { c->config["mlp_bias"] = true; },
       nullptr, "missing tensor 'model.layers.0.mlp.gate_proj.bias'"},
      {"tied embeddings with a different lm_head", false,
       [&](auto* c) { c->config["tie_word_embeddings"] = true; }, nullptr, "tie_word_embeddings"},
      {"truncated safetensors", false, [](auto*) {},
       [](const fs::path& d) { Truncate(d / "model.safetensors", 100); }, "truncated"},
      {"safetensors shorter than its header length", false, [](auto*) {},
       [](const fs::path& d) { fs::resize_file(d / "model.safetensors", 20); }, "header length"},
      {"config.json is not JSON", false, [](auto*) {},
       [](const fs::path& d) { std::ofstream(d / "config.json") << "{\"hidden_size\": 32,"; },
       "config.json is not valid JSON"},
      {"generation_config.json is not JSON", false, [](auto*) {},
       [](const fs::path& d) { std::ofstream(d / "generation_config.json") << "[1,"; },
       "generation_config.json is not valid JSON"},
      {"null hidden_size", false, [](auto* c) { c->config["hidden_size"] = nullptr; }, nullptr,
       "'hidden_size' is required"},
      {"string rms_norm_eps", false, [](auto* c) { c->config["rms_norm_eps"] = "1e-5"; }, nullptr,
       "'rms_norm_eps' must be a finite number"},
      {"string rope_theta", false, [](auto* c) { c->config["rope_theta"] = "1e6"; }, nullptr,
       "'rope_theta' must be a finite number"},
      {"float num_hidden_layers", false, [](auto* c) { c->config["num_hidden_layers"] = 2.5; },
       nullptr, "'num_hidden_layers' must be an integer"},
      {"bool as string", false, [](auto* c) { c->config["tie_word_embeddings"] = "false"; },
       nullptr, "'tie_word_embeddings' must be true or false"},
      {"null rope factor", false,
       [](auto* c) {
         c->config["rope_parameters"] = {{"rope_type", "linear"}, {"factor", nullptr}};
       },
       nullptr, "rope_parameters: field 'factor' is required"},
      {"rope_parameters not an object", false, [](auto* c) { c->config["rope_parameters"] = 7; },
       nullptr, "'rope_parameters' must be an object"},
      {"unknown rope type", false,
       [](auto* c) {
         c->config["rope_scaling"] = {{"rope_type", "ntk-by-parts"}, {"factor", 2}};
       },
       nullptr, "unknown rope type 'ntk-by-parts'"},
      {"unknown rope type (DeepSeek)", true,
       [](auto* c) {
         c->config["rope_parameters"] = {{"rope_type", "wobble"}, {"factor", 2}};
       },
       nullptr, "unknown rope type 'wobble'"},
      {"llama3 rope on DeepSeek", true,
       [](auto* c) {
         c->config["rope_scaling"] = {{"rope_type", "llama3"},
                                      {"factor", 8},
                                      {"low_freq_factor", 1},
                                      {"high_freq_factor", 4},
                                      {"original_max_position_embeddings", 64}};
       },
       nullptr, "rope type 'llama3' is not implemented for DeepSeek"},
      {"hidden_act gelu", false, [](auto* c) { c->config["hidden_act"] = "gelu"; }, nullptr,
       "hidden_act"},
      {"partial_rotary_factor", false, [](auto* c) { c->config["partial_rotary_factor"] = 0.5; },
       nullptr, "partial_rotary_factor"},
      {"nested text_config", false,
       [](auto* c) {
         c->config["text_config"] = {{"hidden_size", 32}};
       },
       nullptr, "text_config"},
      {"eos_token_id of the wrong type", false, [](auto* c) { c->config["eos_token_id"] = "2"; },
       nullptr, "eos_token_id"},
      {"quantization method awq", false,
       [](auto* c) {
         c->config["quantization_config"] = {{"quant_method", "awq"}, {"bits", 4}};
       },
       nullptr, "quantization method awq is not supported"},
      {"quantization method gptq", false,
       [](auto* c) {
         c->config["quantization_config"] = {{"quant_method", "gptq"}};
       },
       nullptr, "quantization method gptq is not supported"},
      {"quantization method mxfp4 (DeepSeek)", true,
       [](auto* c) {
         c->config["quantization_config"] = {{"quant_method", "mxfp4"}};
       },
       nullptr, "quantization method mxfp4 is not supported"},
      {"quantization method bitsandbytes", false,
       [](auto* c) {
         c->config["quantization_config"] = {{"quant_method", "bitsandbytes"}};
       },
       nullptr, "quantization method bitsandbytes is not supported"},
      {"compressed-tensors int4", false,
       [](auto* c) {
         c->config["quantization_config"] = {
             {"quant_method", "compressed-tensors"},
             {"format", "pack-quantized"},
             {"config_groups",
              {{"group_0",
                {{"weights", {{"num_bits", 4}, {"type", "int"}, {"strategy", "group"}}}}}}}};
       },
       nullptr, "format 'pack-quantized'"},
  };
  for (const BrokenCase& c : cases) {
    INFO(c.name);
    TempDir tmp("ckpt_broken");
    TinyCheckpoint ck = c.deepseek ? test::TinyDeepseekV2() : test::TinyLlama("llama");
    c.edit(&ck);
    ck.Write(tmp.path());
    if (c.after) c.after(tmp.path());
    Status st;
    REQUIRE_NOTHROW(st = TryLoad(tmp.path()));
    INFO(st.ToString());
    REQUIRE_FALSE(st.ok());
    CHECK_THAT(st.message(), Catch::Contains(c.expect));
  }
}

TEST_CASE("unsupported quantization is refused before any tensor is read", "[broken_checkpoint]") {
  TempDir tmp("ckpt_quant");
  TinyCheckpoint ck = test::TinyLlama("llama");
  ck.config["quantization_config"] = {{"quant_method", "gptq"}};
  ck.Write(tmp.path());
  std::ofstream(tmp.path() / "model.safetensors", std::ios::trunc) << "garbage";
  const Status st = TryLoad(tmp.path());
  CHECK_THAT(st.message(), Catch::Contains("quantization method gptq is not supported"));
}

// moe_activation_dtype: a value outside its choices, and fp8 activations on the cpu device (dense
// and DeepSeek models alike), are refused naming the option.
TEST_CASE("moe_activation_dtype is refused where it cannot apply", "[broken_checkpoint][fp8]") {
  for (const bool deepseek : {false, true}) {
    TempDir tmp(deepseek ? "moe_act_ds" : "moe_act_llama");
    TinyCheckpoint ck = deepseek ? test::TinyDeepseekV2() : test::TinyLlama("llama");
    ck.Write(tmp.path());
    ModelLoadOptions o;
    o.model_dir = tmp.path().string();
    o.device = "cpu";
    o.block_size = 16;
    o.num_kv_blocks = 4;
    o.moe_activation_dtype = "int8";
    auto m = LoadModel(o);
    REQUIRE(!m.ok());
    CHECK_THAT(m.status().message(), Catch::Contains("moe_activation_dtype"));
    o.moe_activation_dtype = "fp8";
    m = LoadModel(o);
    REQUIRE(!m.ok());
    CHECK_THAT(m.status().message(),
               Catch::Contains("moe_activation_dtype fp8 needs the cuda device"));
    o.moe_activation_dtype = "auto";  // nothing to quantize on the cpu: loads
    CHECK(LoadModel(o).ok());
  }
}

TEST_CASE("checkpoint extras that are consumed or ignored by design still load",
          "[broken_checkpoint]") {
  TempDir tmp("ckpt_ok");
  SECTION("Llama attention_bias and mlp_bias: all seven projections carry biases") {
    TinyCheckpoint ck = test::TinyLlama("llama");
    ck.config["attention_bias"] = true;
    ck.config["mlp_bias"] = true;
    for (int l = 0; l < 2; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      ck.AddF32(p + "self_attn.q_proj.bias", {32}, 0, 0.3f, 10 + l);
      ck.AddF32(p + "self_attn.k_proj.bias", {16}, 0, 0.3f, 20 + l);
      ck.AddF32(p + "self_attn.v_proj.bias", {16}, 0, 0.3f, 30 + l);
      ck.AddF32(p + "self_attn.o_proj.bias", {32}, 0, 0.3f, 40 + l);
      ck.AddF32(p + "mlp.gate_proj.bias", {48}, 0, 0.3f, 50 + l);
      ck.AddF32(p + "mlp.up_proj.bias", {48}, 0, 0.3f, 60 + l);
      ck.AddF32(p + "mlp.down_proj.bias", {32}, 0, 0.3f, 70 + l);
    }
    ck.Write(tmp.path());
    const Status st = TryLoad(tmp.path());
    INFO(st.ToString());
    CHECK(st.ok());
  }
  SECTION("saved rotary tables and a tied copy of the embeddings") {
    TinyCheckpoint ck = test::TinyLlama("llama");
    ck.AddF32("model.layers.0.self_attn.rotary_emb.inv_freq", {4}, 0, 1, 3);
    ck.config["tie_word_embeddings"] = true;
    ck.Find("lm_head.weight")->data = ck.Find("model.embed_tokens.weight")->data;
    ck.Write(tmp.path());
    const Status st = TryLoad(tmp.path());
    INFO(st.ToString());
    CHECK(st.ok());
  }
}

// fp8 checkpoints: each projection weight W becomes e4m3 q with scales s; the reference model
// holds exactly q * s in fp32. Logits must agree bit for bit.
enum class Fp8Layout { kPerTensor, kPerChannel, kBlock };

struct Fp8Case {
  const char* name;
  json quantization_config;
  Fp8Layout layout;
  const char* scale_suffix;  // weight_scale or weight_scale_inv
  bool input_scale;
};

void QuantizeCheckpoint(const Fp8Case& c, TinyCheckpoint* q, TinyCheckpoint* ref) {
  const int64_t block = 16;
  std::vector<TensorToWrite> added;  // appended after the loop: push_back would invalidate `t`
  for (auto& t : q->tensors) {
    const bool proj = t.name.find("_proj.weight") != std::string::npos;
    if (!proj) continue;
    const int64_t rows = t.shape[0], cols = t.shape[1];
    std::vector<float> w = q->F32(t.name);
    std::vector<float> deq(w.size());
    std::vector<uint8_t> bytes(w.size());
    std::vector<int64_t> scale_shape;
    std::vector<float> scales;
    auto scale_index = [&](int64_t r, int64_t col) -> int64_t {
      switch (c.layout) {
        case Fp8Layout::kPerTensor:
          return 0;
        case Fp8Layout::kPerChannel:
          return r;
        case Fp8Layout::kBlock:
          return (r / block) * ((cols + block - 1) / block) + col / block;
      }
      return 0;
    };
    if (c.layout == Fp8Layout::kPerTensor) {
      scale_shape = {};
      scales.assign(1, 0.0f);
    } else if (c.layout == Fp8Layout::kPerChannel) {
      scale_shape = {rows, 1};
      scales.assign(rows, 0.0f);
    } else {
      scale_shape = {(rows + block - 1) / block, (cols + block - 1) / block};
      scales.assign(scale_shape[0] * scale_shape[1], 0.0f);
    }
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t k = 0; k < cols; ++k) {
        float& s = scales[scale_index(r, k)];
        s = std::max(s, std::fabs(w[r * cols + k]) / 448.0f);
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t k = 0; k < cols; ++k) {
        const float s = scales[scale_index(r, k)];
        bytes[r * cols + k] = QuantizeFp8(w[r * cols + k], s);
        deq[r * cols + k] = Fp8E4M3ToFloat(bytes[r * cols + k]) * s;
      }
    }
    std::memcpy(ref->Find(t.name)->data.data(), deq.data(), deq.size() * 4);
    const std::string stem = t.name.substr(0, t.name.size() - std::string(".weight").size());
    t.dtype = DType::kFp8E4M3;
    t.data.assign(reinterpret_cast<const std::byte*>(bytes.data()),
                  reinterpret_cast<const std::byte*>(bytes.data()) + bytes.size());
    TensorToWrite st{stem + "." + c.scale_suffix, DType::kF32, scale_shape,
                     std::vector<std::byte>(scales.size() * 4)};
    std::memcpy(st.data.data(), scales.data(), scales.size() * 4);
    added.push_back(std::move(st));
    if (c.input_scale) {
      TensorToWrite in{stem + ".input_scale", DType::kF32, {}, std::vector<std::byte>(4)};
      const float one = 0.05f;
      std::memcpy(in.data.data(), &one, 4);
      added.push_back(std::move(in));
    }
  }
  for (auto& t : added) q->tensors.push_back(std::move(t));
  q->config["quantization_config"] = c.quantization_config;
}

TEST_CASE("fp8 checkpoints load on the CPU, dequantized exactly", "[broken_checkpoint][fp8]") {
  const json ct_group = {
      {"targets", {"Linear"}},
      {"weights",
       {{"num_bits", 8},
        {"type", "float"},
        {"strategy", "tensor"},
        {"dynamic", false},
        {"symmetric", true}}},
      {"input_activations",
       {{"num_bits", 8}, {"type", "float"}, {"strategy", "tensor"}, {"dynamic", false}}}};
  json ct_channel = ct_group;
  ct_channel["weights"]["strategy"] = "channel";
  ct_channel["input_activations"]["dynamic"] = true;
  const std::vector<Fp8Case> cases = {
      {"compressed-tensors per tensor, static input scale",
       {{"quant_method", "compressed-tensors"},
        {"format", "float-quantized"},
        {"config_groups", {{"group_0", ct_group}}},
        {"ignore", {"lm_head"}}},
       Fp8Layout::kPerTensor,
       "weight_scale",
       true},
      {"compressed-tensors per channel, dynamic activations",
       {{"quant_method", "compressed-tensors"},
        {"format", "float-quantized"},
        {"config_groups", {{"group_0", ct_channel}}}},
       Fp8Layout::kPerChannel,
       "weight_scale",
       false},
      {"modelopt FP8",
       {{"quant_method", "modelopt"}, {"quant_algo", "FP8"}, {"exclude_modules", {"lm_head"}}},
       Fp8Layout::kPerTensor,
       "weight_scale",
       true},
      {"fbgemm_fp8",
       {{"quant_method", "fbgemm_fp8"}, {"activation_scale_ub", 1200.0}},
       Fp8Layout::kPerChannel,
       "weight_scale",
       false},
      {"DeepSeek-V3 style block fp8",
       {{"quant_method", "fp8"},
        {"fmt", "e4m3"},
        {"activation_scheme", "dynamic"},
        {"weight_block_size", {16, 16}}},
       Fp8Layout::kBlock,
       "weight_scale_inv",
       false},
  };
  for (const Fp8Case& c : cases) {
    INFO(c.name);
    TempDir tmp("ckpt_fp8");
    TinyCheckpoint q = test::TinyLlama("llama", 5), ref = q;
    QuantizeCheckpoint(c, &q, &ref);
    q.Write(tmp.path() / "fp8");
    ref.Write(tmp.path() / "ref");
    gpu_test::Logits lq, lr;
    const std::vector<int32_t> prompt = {3, 9, 27, 17, 51, 25, 11, 33};
    const gpu_test::GenerateOptions o{.device = "cpu",
                                      .block_size = 16,
                                      .num_kv_blocks = 8,
                                      .max_batched_tokens = 64,
                                      .steps = 4};
    gpu_test::GenerateOptions oq = o, orf = o;
    oq.logits = &lq;
    orf.logits = &lr;
    gpu_test::Generate((tmp.path() / "fp8").string(), {prompt}, oq);
    gpu_test::Generate((tmp.path() / "ref").string(), {prompt}, orf);
    REQUIRE(lq.at("0").size() == 4);
    for (size_t s = 0; s < 4; ++s) {
      INFO("step " << s);
      const auto& a = lq.at("0")[s];
      const auto& b = lr.at("0")[s];
      REQUIRE(a.size() == b.size());
      CHECK(std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
    }
  }
}

TEST_CASE("fp8 scale of the wrong granularity is refused naming it", "[broken_checkpoint][fp8]") {
  TempDir tmp("ckpt_fp8_bad");
  TinyCheckpoint q = test::TinyLlama("llama", 5), ref = q;
  const Fp8Case c{"",
                  {{"quant_method", "modelopt"}, {"quant_algo", "FP8"}},
                  Fp8Layout::kPerChannel,
                  "weight_scale",
                  true};
  QuantizeCheckpoint(c, &q, &ref);
  q.Write(tmp.path());
  const Status st = TryLoad(tmp.path());
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(st.message(), Catch::Contains("weight_scale"));
  CHECK_THAT(st.message(), Catch::Contains("per-tensor"));
}

}  // namespace
}  // namespace llm
