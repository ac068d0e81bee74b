// gpt-oss's expert tensors and router on the CPU: stacked experts read into the Linear layout
// (float [E, in, out] transposed; MXFP4 blocks dequantized), with expected values worked out by
// hand from transformers' integrations/mxfp4.py convert_moe_packed_tensors (FP4_VALUES table,
// exponent = scale - 127, low nibble to the even element, then [E, out, in] -> transpose(1, 2)),
// and the softmax-over-top-k gate of GptOssTopKRouter.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <vector>

#include "engine/layers/cpu/cpu_moe.h"
#include "engine/layers/moe_router.h"
#include "tiny_checkpoint.h"

namespace llm {
namespace {

std::vector<std::byte> Bytes(const std::vector<uint8_t>& v) {
  std::vector<std::byte> b(v.size());
  std::memcpy(b.data(), v.data(), v.size());
  return b;
}

std::vector<std::byte> F32Bytes(const std::vector<float>& v) {
  std::vector<std::byte> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

TEST_CASE("MXFP4 experts dequantize as transformers' convert_moe_packed_tensors",
          "[mxfp4][moe_experts]") {
  // 2 experts, 3 output rows, 32 inputs (one group of 16 bytes per row).
  const int64_t E = 2, rows = 3, in = 32;
  std::vector<uint8_t> blocks(E * rows * 16, 0x00), scales(E * rows, 127);
  auto byte = [&](int e, int r, int b) -> uint8_t& { return blocks[(e * rows + r) * 16 + b]; };
  byte(0, 0, 0) = 0x21;        // low 1 -> +0.5 (element 0), high 2 -> +1.0 (element 1)
  byte(0, 0, 1) = 0xF7;        // low 7 -> +6.0, high F -> -6.0
  scales[0 * rows + 1] = 129;  // 2^2
  byte(0, 1, 0) = 0x9A;        // low A -> -1.0 * 4, high 9 -> -0.5 * 4
  byte(0, 1, 15) = 0x53;       // low 3 -> 1.5 * 4 (element 30), high 5 -> 3.0 * 4 (element 31)
  scales[0 * rows + 2] = 120;  // 2^-7
  byte(0, 2, 7) = 0x0C;        // low C -> -2.0 / 128 (element 14), high 0 -> +0
  scales[1 * rows + 0] = 126;  // expert 1: 2^-1
  byte(1, 0, 0) = 0x44;        // 2.0 / 2 twice
  byte(1, 2, 3) = 0x80;        // low 0 -> +0, high 8 -> -0.0

  test::TempDir dir("moe_experts_mxfp4");
  REQUIRE(WriteSafetensors((dir.path() / "model.safetensors").string(),
                           {{"e.gate_up_proj_blocks", DType::kU8, {E, rows, 1, 16}, Bytes(blocks)},
                            {"e.gate_up_proj_scales", DType::kU8, {E, rows, 1}, Bytes(scales)}})
              .ok());
  auto store = WeightStore::Open(dir.path().string());
  REQUIRE(store.ok());
  std::vector<float> w;
  // Without quantization_config mxfp4 the blocks are refused by name.
  Status st = ReadExpertMatrix(**store, "e.gate_up_proj", E, in, rows, &w);
  REQUIRE(!st.ok());
  CHECK(st.message().find("e.gate_up_proj_blocks") != std::string::npos);

  WeightQuantization q;
  q.method = WeightQuantization::Method::kMxfp4;
  q.quant_method = "mxfp4";
  (*store)->set_quantization(q);
  REQUIRE(ReadExpertMatrix(**store, "e.gate_up_proj", E, in, rows, &w).ok());
  REQUIRE(w.size() == static_cast<size_t>(E * rows * in));
  // transformers' result is [E, in, out]; ours [E, out, in]: at(e, r, c) = theirs[e][c][r].
  auto at = [&](int e, int r, int c) { return w[(e * rows + r) * in + c]; };
  CHECK(at(0, 0, 0) == 0.5f);
  CHECK(at(0, 0, 1) == 1.0f);
  CHECK(at(0, 0, 2) == 6.0f);
  CHECK(at(0, 0, 3) == -6.0f);
  CHECK(at(0, 1, 0) == -4.0f);
  CHECK(at(0, 1, 1) == -2.0f);
  CHECK(at(0, 1, 30) == 6.0f);
  CHECK(at(0, 1, 31) == 12.0f);
  CHECK(at(0, 2, 14) == -2.0f / 128.0f);
  CHECK(at(0, 2, 15) == 0.0f);
  CHECK(at(1, 0, 0) == 1.0f);
  CHECK(at(1, 0, 1) == 1.0f);
  CHECK(at(1, 2, 7) == 0.0f);
  CHECK(std::signbit(at(1, 2, 7)));
  int nonzero = 0;
  for (float v : w) nonzero += v != 0.0f;
  CHECK(nonzero == 11);  // nothing else was written
}

TEST_CASE("MXFP4 experts with a wrong dtype or shape are refused by name", "[mxfp4][moe_experts]") {
  const int64_t E = 1, rows = 2, in = 64;
  std::vector<uint8_t> blocks(E * rows * 2 * 16, 0x11);
  std::vector<float> f32_scales(E * rows * 2, 127.0f);
  test::TempDir dir("moe_experts_mxfp4_bad");
  REQUIRE(
      WriteSafetensors((dir.path() / "model.safetensors").string(),
                       {{"e.down_proj_blocks", DType::kU8, {E, rows, 2, 16}, Bytes(blocks)},
                        {"e.down_proj_scales", DType::kF32, {E, rows, 2}, F32Bytes(f32_scales)}})
          .ok());
  auto store = WeightStore::Open(dir.path().string());
  REQUIRE(store.ok());
  WeightQuantization q;
  q.method = WeightQuantization::Method::kMxfp4;
  (*store)->set_quantization(q);
  std::vector<float> w;
  Status st = ReadExpertMatrix(**store, "e.down_proj", E, in, rows, &w);
  REQUIRE(!st.ok());
  CHECK(st.message().find("e.down_proj_scales") != std::string::npos);
  CHECK(st.message().find("uint8") != std::string::npos);
  // An input dimension of 96 needs 3 groups per row, the checkpoint has 2.
  st = ReadExpertMatrix(**store, "e.down_proj", E, 96, rows, &w);
  REQUIRE(!st.ok());
  CHECK(st.message().find("e.down_proj_blocks") != std::string::npos);
}

TEST_CASE("Stacked float experts [E, in, out] read transposed", "[moe_experts]") {
  const int64_t E = 2, in = 3, out = 2;
  std::vector<float> stored(E * in * out);
  for (size_t i = 0; i < stored.size(); ++i) stored[i] = static_cast<float>(i);
  test::TempDir dir("moe_experts_f32");
  REQUIRE(WriteSafetensors((dir.path() / "model.safetensors").string(),
                           {{"e.down_proj", DType::kF32, {E, in, out}, F32Bytes(stored)}})
              .ok());
  auto store = WeightStore::Open(dir.path().string());
  REQUIRE(store.ok());
  std::vector<float> w;
  REQUIRE(ReadExpertMatrix(**store, "e.down_proj", E, in, out, &w).ok());
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t r = 0; r < out; ++r) {
      for (int64_t c = 0; c < in; ++c) {
        CHECK(w[(e * out + r) * in + c] == stored[(e * in + c) * out + r]);
      }
    }
  }
  // A transposed (wrong) shape names the tensor.
  CHECK(!ReadExpertMatrix(**store, "e.down_proj", E, out, in, &w).ok());
}

TEST_CASE("Softmax of the top-k logits (GptOssTopKRouter)", "[moe_experts][routing]") {
  MoeRouting r;
  r.num_experts = 4;
  r.top_k = 2;
  r.scoring = MoeRouting::Scoring::kSoftmaxOfTopK;
  MoeRouter gate(r);
  const float logits[4] = {1.0f, 3.0f, 2.0f, -1.0f};
  int32_t ids[2];
  float w[2], margin = 0;
  gate.Route(logits, nullptr, ids, w, &margin);
  CHECK(ids[0] == 1);
  CHECK(ids[1] == 2);
  const double e = std::exp(1.0);
  CHECK(w[0] == Approx(e / (e + 1.0)).epsilon(1e-6));
  CHECK(w[1] == Approx(1.0 / (e + 1.0)).epsilon(1e-6));
  CHECK(margin == 1.0f);  // in logits: 2 (last selected) - 1 (best left out)
}

}  // namespace
}  // namespace llm
