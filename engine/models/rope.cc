#include "engine/models/rope.h"

#include <cmath>
#include <numbers>

namespace llm {

std::vector<float> RopeInvFreq(const ModelConfig& c) {
  const int half = c.head_dim / 2;
  std::vector<float> inv(half);
  const RopeScaling& rs = c.rope_scaling;
  for (int i = 0; i < half; ++i) {
    double f =
        1.0 / std::pow(static_cast<double>(c.rope_theta), static_cast<double>(2 * i) / c.head_dim);
    if (rs.type == RopeScaling::Type::kLinear) {
      f /= rs.factor;
    } else if (rs.type == RopeScaling::Type::kLlama3) {
      // Llama 3.1: keep high frequencies, divide low ones by `factor`, interpolate between.
      const double old_len = rs.original_max_position_embeddings;
      const double wavelen = 2.0 * std::numbers::pi / f;
      if (wavelen > old_len / rs.low_freq_factor) {
        f /= rs.factor;
      } else if (wavelen >= old_len / rs.high_freq_factor) {
        const double smooth =
            (old_len / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
        f = (1.0 - smooth) * f / rs.factor + smooth * f;
      }
    }
    inv[i] = static_cast<float>(f);
  }
  return inv;
}

}  // namespace llm
