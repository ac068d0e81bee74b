// MXFP4 (OCP microscaling FP4), as gpt-oss checkpoints store their expert weights: groups of 32
// e2m1 values share one e8m0 scale. A "_blocks" tensor [..., groups, 16] of u8 packs two values
// per byte, the low nibble first (element 2i in the low nibble, 2i + 1 in the high one); its
// "_scales" tensor [..., groups] holds the biased exponent e of each group: value = fp4 * 2^(e -
// 127). This is transformers' integrations/mxfp4.py dequantization (its FP4 lookup table and
// ldexp), which the checkpoint's rows follow ([experts, out_features, in_features / 32, 16]).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

namespace llm {

// e2m1: sign, 2 exponent bits (bias 1), 1 mantissa bit; no infinities or NaN.
inline float Fp4E2M1ToFloat(uint8_t nibble) {
  static constexpr float kValues[16] = {+0.0f, +0.5f, +1.0f, +1.5f, +2.0f, +3.0f, +4.0f, +6.0f,
                                        -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  return kValues[nibble & 0x0F];
}

// out[g * 32 + j] for `groups` groups: blocks [groups, 16] bytes, scales [groups] e8m0 bytes.
// Exact in fp32 (ldexp of a 2-bit-mantissa value); exponents far outside fp32's range give 0 or
// inf, as ldexp does.
inline void DequantizeMxfp4(const uint8_t* blocks, const uint8_t* scales, size_t groups,
                            float* out) {
  for (size_t g = 0; g < groups; ++g) {
    const int exp = static_cast<int>(scales[g]) - 127;
    for (int b = 0; b < 16; ++b) {
      const uint8_t byte = blocks[g * 16 + b];
      out[g * 32 + 2 * b] = std::ldexp(Fp4E2M1ToFloat(byte & 0x0F), exp);
      out[g * 32 + 2 * b + 1] = std::ldexp(Fp4E2M1ToFloat(byte >> 4), exp);
    }
  }
}

}  // namespace llm
