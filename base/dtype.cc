#include "base/dtype.h"

#include "base/quant.h"

#include <cmath>

namespace llm {

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "float32";
    case DType::kF16:
      return "float16";
    case DType::kBF16:
      return "bfloat16";
    case DType::kI8:
      return "int8";
    case DType::kFp8E4M3:
      return "fp8_e4m3";
    case DType::kU8:
      return "uint8";
  }
  return "?";
}

int DTypeSize(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
      return 2;
    case DType::kI8:
    case DType::kFp8E4M3:
    case DType::kU8:
      return 1;
  }
  return 0;
}

bool ParseDType(std::string_view s, DType* out) {
  if (s == "float32" || s == "fp32" || s == "F32") {
    *out = DType::kF32;
  } else if (s == "float16" || s == "fp16" || s == "half" || s == "F16") {
    *out = DType::kF16;
  } else if (s == "bfloat16" || s == "bf16" || s == "BF16") {
    *out = DType::kBF16;
  } else if (s == "int8" || s == "I8") {
    *out = DType::kI8;
  } else if (s == "fp8_e4m3" || s == "F8_E4M3") {
    *out = DType::kFp8E4M3;
  } else {
    return false;
  }
  return true;
}

float F16ToF32(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1u;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), -24);  // subnormal
  } else if (exp == 31) {
    v = mant ? NAN : INFINITY;
  } else {
    v = std::ldexp(static_cast<float>(mant | 0x400u), static_cast<int>(exp) - 25);
  }
  return sign ? -v : v;
}

uint16_t F32ToF16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (absx < 0x38800000u) {
    // Subnormal half: round(|f| * 2^24) with ties to even.
    float a;
    std::memcpy(&a, &absx, 4);
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(a * 16777216.0f)));
  }
  uint32_t r = absx - 0x38000000u;  // rebias exponent 127 -> 15 (shifted by 13 below)
  r += 0xfffu + ((r >> 13) & 1u);   // round to nearest even on the 13 dropped bits
  return static_cast<uint16_t>(sign | (r >> 13));
}

void ConvertToF32(DType t, const void* src, float* dst, size_t n) {
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::kBF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = Bf16ToF32(s[i]);
      return;
    }
    case DType::kF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = F16ToF32(s[i]);
      return;
    }
    case DType::kI8: {
      const auto* s = static_cast<const int8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = s[i];
      return;
    }
    case DType::kFp8E4M3: {
      const auto* s = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = Fp8E4M3ToFloat(s[i]);
      return;
    }
    case DType::kU8: {
      const auto* s = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = s[i];
      return;
    }
  }
}

}  // namespace llm
