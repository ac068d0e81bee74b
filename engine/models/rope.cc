#include "engine/models/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace llm {
namespace {

double CorrectionDim(double rotations, int dim, double base, int max_pos) {
  return dim * std::log(max_pos / (rotations * 2.0 * std::numbers::pi)) / (2.0 * std::log(base));
}

}  // namespace

std::vector<float> YarnInvFreq(const YarnFreqParams& p) {
  const int dim = p.dim, half = dim / 2;
  double low = CorrectionDim(p.beta_fast, dim, p.base, p.original_max_position_embeddings);
  double high = CorrectionDim(p.beta_slow, dim, p.base, p.original_max_position_embeddings);
  if (p.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;
  std::vector<float> inv(half);
  for (int i = 0; i < half; ++i) {
    const double extra = 1.0 / std::pow(p.base, static_cast<double>(2 * i) / dim);
    const double inter = extra / p.factor;
    // inv_freq = inter * (1 - mask) + extra * mask, mask = 1 - clamp((i - low) / (high - low)).
    const double mask = 1.0 - std::clamp((i - low) / (high - low), 0.0, 1.0);
    inv[i] = static_cast<float>(inter * (1.0 - mask) + extra * mask);
  }
  return inv;
}

std::vector<float> RopeInvFreq(const ModelConfig& c) {
  const int half = c.head_dim / 2;
  const RopeScaling& rs = c.rope_scaling;
  if (rs.type == RopeScaling::Type::kYarn) {
    YarnFreqParams y;
    y.dim = c.head_dim;
    y.base = c.rope_theta;
    y.factor = rs.factor;
    y.original_max_position_embeddings = rs.original_max_position_embeddings;
    y.beta_fast = rs.beta_fast;
    y.beta_slow = rs.beta_slow;
    y.truncate = rs.truncate;
    return YarnInvFreq(y);
  }
  std::vector<float> inv(half);
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
