#include "engine/sampling/token_mask.h"

#include <limits>

namespace llm {

int ApplyTokenMask(std::span<float> logits, const uint32_t* mask, size_t mask_tokens) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  int allowed = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (i < mask_tokens && ((mask[i >> 5] >> (i & 31)) & 1u)) {
      ++allowed;
    } else {
      logits[i] = kNegInf;
    }
  }
  return allowed;
}

}  // namespace llm
