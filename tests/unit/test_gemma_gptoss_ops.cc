// The building blocks Gemma 2/3 and gpt-oss need on the CPU, against their definitions written
// out independently here: MXFP4 dequantization (transformers' integrations/mxfp4.py), GELU-tanh
// GeGLU (gelu_pytorch_tanh) and gpt-oss's clamped, interleaved SwiGLU (GptOssExperts).
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "base/mxfp4.h"
#include "engine/layers/cpu/cpu_ops.h"

namespace llm {
namespace {

TEST_CASE("MXFP4 dequantization: e2m1 nibbles low first, e8m0 scales", "[mxfp4]") {
  // Every nibble value, in both halves of a byte, under scales 2^0, 2^-3 and 2^5.
  std::vector<uint8_t> blocks(3 * 16), scales = {127, 124, 132};
  for (int g = 0; g < 3; ++g) {
    for (int b = 0; b < 16; ++b) {
      blocks[g * 16 + b] = static_cast<uint8_t>((b & 0x0F) | (((15 - b) & 0x0F) << 4));
    }
  }
  std::vector<float> out(3 * 32);
  DequantizeMxfp4(blocks.data(), scales.data(), 3, out.data());
  // e2m1 magnitudes by code: 0, 0.5 (subnormal), 1, 1.5, 2, 3, 4, 6; bit 3 is the sign.
  const double mags[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
  auto value = [&](int code) { return (code & 8 ? -1.0 : 1.0) * mags[code & 7]; };
  const double mult[3] = {1.0, 0.125, 32.0};
  for (int g = 0; g < 3; ++g) {
    for (int b = 0; b < 16; ++b) {
      INFO("group " << g << " byte " << b);
      CHECK(out[g * 32 + 2 * b] == value(b) * mult[g]);
      CHECK(out[g * 32 + 2 * b + 1] == value(15 - b) * mult[g]);
    }
  }
  CHECK(std::signbit(out[2 * 8]));  // code 8 is -0
}

TEST_CASE("GeluTanhMul is gelu_pytorch_tanh(gate) * up", "[gemma_ops]") {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> uni(-6.0f, 6.0f);
  const int rows = 3, inter = 37;
  std::vector<float> gu(rows * 2 * inter), act(rows * inter);
  for (float& x : gu) x = uni(rng);
  cpu::GeluTanhMul(gu.data(), rows, inter, act.data());
  for (int t = 0; t < rows; ++t) {
    for (int i = 0; i < inter; ++i) {
      const double g = gu[t * 2 * inter + i], u = gu[t * 2 * inter + inter + i];
      const double want =
          0.5 * g * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g))) * u;
      REQUIRE(std::abs(act[t * inter + i] - want) <= 1e-5 * std::max(1.0, std::abs(want)));
    }
  }
}

TEST_CASE("ClampedSwiGlu: interleaved gate/up, clamps, (up + 1) * gate * sigmoid(alpha gate)",
          "[gptoss_ops]") {
  // Values past the limit on both sides, so both clamps matter.
  const float alpha = 1.702f, limit = 7.0f;
  const std::vector<float> gu = {9.0f, 9.0f, -9.0f, -9.0f, 0.5f, -0.25f, 3.0f, 8.0f};
  std::vector<float> act(4);
  cpu::ClampedSwiGlu(gu.data(), 1, 4, alpha, limit, act.data());
  auto ref = [&](double gate, double up) {
    gate = std::min(gate, 7.0);
    up = std::min(std::max(up, -7.0), 7.0);
    return (up + 1.0) * gate / (1.0 + std::exp(-1.702 * gate));
  };
  for (int i = 0; i < 4; ++i) {
    const double want = ref(gu[2 * i], gu[2 * i + 1]);
    INFO("pair " << i);
    CHECK(std::abs(act[i] - want) <= 1e-5 * std::max(1.0, std::abs(want)));
  }
  // gate -9 is not clamped below (only above): its sigmoid term is tiny but not zero.
  CHECK(act[1] != 0.0f);
  CHECK(act[1] == Approx(ref(-9.0, -9.0)).epsilon(1e-5));
}

}  // namespace
}  // namespace llm
