// 8-bit KV-cache element formats. These functions ARE the storage definition: the CPU reference
// and every GPU kernel must produce bit-identical bytes for the same float input and scale.
//
// int8 (symmetric, no offset): q = clamp(rint(x / scale), -127, 127) as two's-complement int8,
//   rint = round half to even; -128 is never produced. Dequant: x' = q * scale.
// fp8 e4m3fn (OCP "FN": bias 7, no infinities, 0x7f/0xff are NaN, max finite 448):
//   q = e4m3(x / scale), round to nearest even, saturating to +-448; NaN input -> 0x7f.
//   Dequant: x' = e4m3_to_float(q) * scale.
// Scales are "dequant" scales (absmax / 127 for int8, absmax / 448 for fp8), never zero: a zero
// absmax uses scale 1.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace llm {

inline int8_t QuantizeInt8(float x, float scale) {
  float q = std::nearbyint(x / scale);  // default rounding mode: to nearest, ties to even
  if (!(q == q)) q = 0.0f;              // NaN -> 0
  q = std::fmin(std::fmax(q, -127.0f), 127.0f);
  return static_cast<int8_t>(q);
}

inline float DequantizeInt8(int8_t q, float scale) {
  return static_cast<float>(q) * scale;
}

// e4m3fn byte -> float (exact).
inline float Fp8E4M3ToFloat(uint8_t v) {
  const int sign = v >> 7;
  const int exp = (v >> 3) & 0xf;
  const int mant = v & 0x7;
  float f;
  if (exp == 0xf && mant == 0x7) {
    f = NAN;
  } else if (exp == 0) {
    f = std::ldexp(static_cast<float>(mant), -9);  // subnormal: mant/8 * 2^-6
  } else {
    f = std::ldexp(static_cast<float>(8 + mant), exp - 10);  // (1 + mant/8) * 2^(exp-7)
  }
  return sign ? -f : f;
}

// float -> e4m3fn byte, round to nearest even, saturating at +-448.
inline uint8_t FloatToFp8E4M3(float x) {
  if (std::isnan(x)) return 0x7f;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  float a = std::fabs(x);
  if (a >= 448.0f) return sign | 0x7e;  // 448 = exp 15, mant 6
  // Smallest normal is 2^-6; below it the grid step is 2^-9.
  if (a < 0.015625f) {
    const int m = static_cast<int>(std::nearbyint(a * 512.0f));  // 0..8; 8 becomes the min normal
    return sign | static_cast<uint8_t>(m);  // m == 8 encodes exp 1, mant 0: still correct bits
  }
  int e;
  const float fr = std::frexp(a, &e);  // a = fr * 2^e, fr in [0.5, 1)
  // Normal: a = (1 + mant/8) * 2^(E-7), E = e - 1 + 7.
  float mant = std::nearbyint((fr * 2.0f - 1.0f) * 8.0f);  // 0..8
  int biased = e - 1 + 7;
  if (mant >= 8.0f) {
    mant = 0.0f;
    ++biased;
  }
  if (biased > 15 || (biased == 15 && mant > 6.0f)) return sign | 0x7e;
  return sign | static_cast<uint8_t>((biased << 3) | static_cast<int>(mant));
}

inline uint8_t QuantizeFp8(float x, float scale) {
  return FloatToFp8E4M3(x / scale);
}
inline float DequantizeFp8(uint8_t q, float scale) {
  return Fp8E4M3ToFloat(q) * scale;
}

// Dynamic (per-token) dequant scale from a vector's absmax (NaNs ignored, as fmax does):
// absmax / qmax, or 1 when that is not a positive finite number (all zeros, underflow, inf).
inline float DynamicScale(float absmax, float qmax) {
  const float scale = absmax / qmax;
  return (scale > 0.0f && std::isfinite(scale)) ? scale : 1.0f;
}

constexpr float kInt8Max = 127.0f;
constexpr float kFp8E4M3Max = 448.0f;

}  // namespace llm
