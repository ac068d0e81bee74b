// Element types of weights and KV caches, and scalar conversions to fp32.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace llm {

// kU8: raw bytes (MXFP4 blocks and e8m0 scales); never a float weight by itself.
enum class DType { kF32, kF16, kBF16, kI8, kFp8E4M3, kU8 };

const char* DTypeName(DType t);
// Bytes per element.
int DTypeSize(DType t);
// Parses "float32"/"fp32", "float16"/"fp16"/"half", "bfloat16"/"bf16", "int8", "fp8_e4m3".
bool ParseDType(std::string_view s, DType* out);

inline float Bf16ToF32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even, as torch does; NaN stays NaN.
inline uint16_t F32ToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float F16ToF32(uint16_t h);
uint16_t F32ToF16(float f);

// Converts n elements of type `t` at src to fp32.
void ConvertToF32(DType t, const void* src, float* dst, size_t n);

}  // namespace llm
