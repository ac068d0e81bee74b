// Tests for the scalar dtype conversions: bf16 rounding, f16 normals, subnormals, inf/nan,
// overflow, and an exhaustive f16 round trip.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "base/dtype.h"

namespace llm {
namespace {

float FromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint32_t ToBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return bits;
}

bool IsHalfNan(uint16_t h) {
  return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0;
}

TEST_CASE("F32ToBf16 rounds to nearest even", "[dtype]") {
  CHECK(F32ToBf16(1.0f) == 0x3f80);
  CHECK(F32ToBf16(-2.0f) == 0xc000);
  CHECK(F32ToBf16(0.0f) == 0x0000);
  CHECK(F32ToBf16(-0.0f) == 0x8000);
  // Exactly representable values pass through.
  CHECK(F32ToBf16(FromBits(0x3f810000u)) == 0x3f81);
  // Below half: down. Above half: up.
  CHECK(F32ToBf16(FromBits(0x3f807fffu)) == 0x3f80);
  CHECK(F32ToBf16(FromBits(0x3f808001u)) == 0x3f81);
  // Exactly half: to the even neighbour.
  CHECK(F32ToBf16(FromBits(0x3f808000u)) == 0x3f80);  // 0x3f80 is even
  CHECK(F32ToBf16(FromBits(0x3f818000u)) == 0x3f82);  // 0x3f81 is odd
  CHECK(F32ToBf16(FromBits(0xbf818000u)) == 0xbf82);  // sign does not matter
  // Rounding carries into the exponent.
  CHECK(F32ToBf16(FromBits(0x3fffffffu)) == 0x4000);
  // Infinities stay; the largest float rounds up to infinity.
  CHECK(F32ToBf16(std::numeric_limits<float>::infinity()) == 0x7f80);
  CHECK(F32ToBf16(-std::numeric_limits<float>::infinity()) == 0xff80);
  CHECK(F32ToBf16(std::numeric_limits<float>::max()) == 0x7f80);
  // NaN stays NaN, even when its payload lives only in the dropped bits.
  CHECK(std::isnan(Bf16ToF32(F32ToBf16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(std::isnan(Bf16ToF32(F32ToBf16(FromBits(0x7f800001u)))));
  CHECK(std::isnan(Bf16ToF32(F32ToBf16(FromBits(0xff800001u)))));
  // Subnormal floats round like any other.
  CHECK(F32ToBf16(FromBits(0x00008000u)) == 0x0000);
  CHECK(F32ToBf16(FromBits(0x00018000u)) == 0x0002);
}

TEST_CASE("Bf16 round trip of every non-NaN pattern is exact", "[dtype]") {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    const float f = Bf16ToF32(bits);
    CHECK(ToBits(f) == (h << 16));
    if (std::isnan(f)) continue;
    REQUIRE(F32ToBf16(f) == bits);
  }
}

TEST_CASE("F16 conversion of normal values", "[dtype]") {
  const std::pair<float, uint16_t> cases[] = {
      {1.0f, 0x3c00},
      {-2.0f, 0xc000},
      {0.5f, 0x3800},
      {65504.0f, 0x7bff},
      {-65504.0f, 0xfbff},
      {0.333251953125f, 0x3555},
      {6.103515625e-05f, 0x0400},  // 2^-14
      {1.0009765625f, 0x3c01},
      {1024.0f, 0x6400},
  };
  for (const auto& [f, h] : cases) {
    INFO("value " << f);
    CHECK(F32ToF16(f) == h);
    CHECK(F16ToF32(h) == f);
  }
  CHECK(F16ToF32(0x0000) == 0.0f);
  CHECK_FALSE(std::signbit(F16ToF32(0x0000)));
  CHECK(std::signbit(F16ToF32(0x8000)));
  CHECK(F32ToF16(0.0f) == 0x0000);
  CHECK(F32ToF16(-0.0f) == 0x8000);
}

TEST_CASE("F16 rounding to nearest even", "[dtype]") {
  // Between 1 and 1 + 2^-10: exactly half goes to the even 1.0, just above goes up.
  CHECK(F32ToF16(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);
  CHECK(F32ToF16(std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f)) == 0x3c01);
  CHECK(F32ToF16(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);  // half above odd 0x3c01
  CHECK(F32ToF16(std::nextafter(1.0f + std::ldexp(1.0f, -11), 0.0f)) == 0x3c00);
  // Mantissa carry into the exponent: 2 - 2^-12 rounds to 2.
  CHECK(F32ToF16(2.0f - std::ldexp(1.0f, -12)) == 0x4000);
  // The boundary with subnormals: just below 2^-14 by half an ulp of the subnormal grid.
  CHECK(F32ToF16(std::ldexp(1023.5f, -24)) == 0x0400);
}

TEST_CASE("F16 conversion of subnormals", "[dtype]") {
  const float min_sub = std::ldexp(1.0f, -24);
  CHECK(F16ToF32(0x0001) == min_sub);
  CHECK(F16ToF32(0x03ff) == std::ldexp(1023.0f, -24));
  CHECK(F16ToF32(0x8001) == -min_sub);
  CHECK(F32ToF16(min_sub) == 0x0001);
  CHECK(F32ToF16(std::ldexp(1023.0f, -24)) == 0x03ff);
  CHECK(F32ToF16(-std::ldexp(5.0f, -24)) == 0x8005);
  // Ties to even on the subnormal grid.
  CHECK(F32ToF16(std::ldexp(1.0f, -25)) == 0x0000);  // half of the smallest: to 0
  CHECK(F32ToF16(std::ldexp(3.0f, -25)) == 0x0002);  // 1.5 ulp: to 2
  CHECK(F32ToF16(std::ldexp(5.0f, -25)) == 0x0002);  // 2.5 ulp: to 2
  CHECK(F32ToF16(std::ldexp(1.0f, -25) * 1.0001f) == 0x0001);
  // Far below: zero with the sign kept.
  CHECK(F32ToF16(1e-10f) == 0x0000);
  CHECK(F32ToF16(-1e-10f) == 0x8000);
  CHECK(F32ToF16(FromBits(0x00000001u)) == 0x0000);  // a float subnormal
}

TEST_CASE("F16 inf, nan and overflow", "[dtype]") {
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(F16ToF32(0x7c00) == inf);
  CHECK(F16ToF32(0xfc00) == -inf);
  CHECK(std::isnan(F16ToF32(0x7e00)));
  CHECK(std::isnan(F16ToF32(0x7c01)));
  CHECK(std::isnan(F16ToF32(0xfe00)));
  CHECK(F32ToF16(inf) == 0x7c00);
  CHECK(F32ToF16(-inf) == 0xfc00);
  CHECK(IsHalfNan(F32ToF16(std::numeric_limits<float>::quiet_NaN())));
  CHECK(IsHalfNan(F32ToF16(FromBits(0x7f800001u))));  // payload only in dropped bits
  CHECK(IsHalfNan(F32ToF16(FromBits(0xffc00000u))));
  // Overflow: 65520 is the midpoint between 65504 and 2^16 and rounds (to even) to inf.
  CHECK(F32ToF16(65519.996f) == 0x7bff);
  CHECK(F32ToF16(65520.0f) == 0x7c00);
  CHECK(F32ToF16(1e10f) == 0x7c00);
  CHECK(F32ToF16(-1e10f) == 0xfc00);
  CHECK(F32ToF16(std::numeric_limits<float>::max()) == 0x7c00);
}

TEST_CASE("F16 round trip of every non-NaN pattern is exact", "[dtype]") {
  int nans = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    const float f = F16ToF32(bits);
    if (IsHalfNan(bits)) {
      REQUIRE(std::isnan(f));
      REQUIRE(IsHalfNan(F32ToF16(f)));
      ++nans;
      continue;
    }
    REQUIRE_FALSE(std::isnan(f));
    INFO("half bits " << h);
    REQUIRE(F32ToF16(f) == bits);
  }
  CHECK(nans == 2 * 1023);
  // Positive halves decode in increasing order.
  for (uint32_t h = 1; h <= 0x7c00; ++h) {
    REQUIRE(F16ToF32(static_cast<uint16_t>(h)) > F16ToF32(static_cast<uint16_t>(h - 1)));
  }
}

#if defined(__FLT16_MAX__)
TEST_CASE("F32ToF16 agrees with the compiler's _Float16 on random floats", "[dtype]") {
  std::mt19937 rng(99);
  std::uniform_int_distribution<uint32_t> bits_dist;
  // Mostly values in the half range (exponents 100..150), plus arbitrary bit patterns.
  for (int i = 0; i < 200000; ++i) {
    uint32_t bits = bits_dist(rng);
    if (i % 4 != 0) {
      const uint32_t exp = 100 + bits_dist(rng) % 51;
      bits = (bits & 0x807fffffu) | (exp << 23);
    }
    const float f = FromBits(bits);
    if (std::isnan(f)) continue;
    const _Float16 ref = static_cast<_Float16>(f);
    uint16_t ref_bits;
    std::memcpy(&ref_bits, &ref, 2);
    INFO("float bits " << bits);
    REQUIRE(F32ToF16(f) == ref_bits);
  }
}
#endif

TEST_CASE("DType names, sizes and ConvertToF32", "[dtype]") {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kI8, DType::kFp8E4M3}) {
    DType parsed;
    REQUIRE(ParseDType(DTypeName(t), &parsed));
    CHECK(parsed == t);
  }
  DType t;
  CHECK(ParseDType("bf16", &t));
  CHECK(t == DType::kBF16);
  CHECK(ParseDType("half", &t));
  CHECK(t == DType::kF16);
  CHECK_FALSE(ParseDType("float64", &t));
  CHECK(DTypeSize(DType::kF32) == 4);
  CHECK(DTypeSize(DType::kF16) == 2);
  CHECK(DTypeSize(DType::kBF16) == 2);
  CHECK(DTypeSize(DType::kI8) == 1);

  const uint16_t halves[] = {0x3c00, 0xc000, 0x0001};
  float out[3];
  ConvertToF32(DType::kF16, halves, out, 3);
  CHECK(out[0] == 1.0f);
  CHECK(out[1] == -2.0f);
  CHECK(out[2] == std::ldexp(1.0f, -24));
  const uint16_t bf[] = {0x3f80, 0x4040};
  ConvertToF32(DType::kBF16, bf, out, 2);
  CHECK(out[0] == 1.0f);
  CHECK(out[1] == 3.0f);
  const int8_t i8[] = {-128, 0, 127};
  ConvertToF32(DType::kI8, i8, out, 3);
  CHECK(out[0] == -128.0f);
  CHECK(out[1] == 0.0f);
  CHECK(out[2] == 127.0f);
  const float f32[] = {1.5f, -0.25f};
  ConvertToF32(DType::kF32, f32, out, 2);
  CHECK(out[0] == 1.5f);
  CHECK(out[1] == -0.25f);
}

}  // namespace
}  // namespace llm
