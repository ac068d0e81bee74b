#include "engine/loader/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace llm {
namespace {

double CorrectionDim(double rotations, int dim, double base, int max_pos) {
  return dim * std::log(max_pos / (rotations * 2.0 * std::numbers::pi)) / (2.0 * std::log(base));
}

// YaRN: interpolated (inv / factor) below the ramp, extrapolated (inv) above it, blended between
// the correction dims of beta_fast and beta_slow.
void ApplyYarn(int dim, double base, const RopeScaling& rs, std::vector<double>* inv) {
  double low = CorrectionDim(rs.beta_fast, dim, base, rs.original_max_position_embeddings);
  double high = CorrectionDim(rs.beta_slow, dim, base, rs.original_max_position_embeddings);
  if (rs.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;
  for (size_t i = 0; i < inv->size(); ++i) {
    const double extra = (*inv)[i], inter = extra / rs.factor;
    // inv_freq = inter * (1 - mask) + extra * mask, mask = 1 - clamp((i - low) / (high - low)).
    const double mask = 1.0 - std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    (*inv)[i] = inter * (1.0 - mask) + extra * mask;
  }
}

// Llama 3.1: keep high frequencies, divide low ones by `factor`, interpolate between.
void ApplyLlama3(const RopeScaling& rs, std::vector<double>* inv) {
  const double old_len = rs.original_max_position_embeddings;
  for (double& f : *inv) {
    const double wavelen = 2.0 * std::numbers::pi / f;
    if (wavelen > old_len / rs.low_freq_factor) {
      f /= rs.factor;
    } else if (wavelen >= old_len / rs.high_freq_factor) {
      const double smooth =
          (old_len / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
      f = (1.0 - smooth) * f / rs.factor + smooth * f;
    }
  }
}

}  // namespace

std::vector<float> RopeInvFreq(int dim, double theta, const RopeScaling& rs) {
  std::vector<double> inv(dim / 2);
  for (int i = 0; i < dim / 2; ++i) {
    inv[i] = 1.0 / std::pow(theta, static_cast<double>(2 * i) / dim);
  }
  switch (rs.type) {
    case RopeScaling::Type::kNone:
      break;
    case RopeScaling::Type::kLinear:
      for (double& f : inv) f /= rs.factor;
      break;
    case RopeScaling::Type::kLlama3:
      ApplyLlama3(rs, &inv);
      break;
    case RopeScaling::Type::kYarn:
      ApplyYarn(dim, theta, rs, &inv);
      break;
  }
  return std::vector<float>(inv.begin(), inv.end());
}

std::vector<float> RopeInvFreq(const ModelConfig& c) {
  return RopeInvFreq(c.head_dim, static_cast<double>(c.rope_theta), c.rope_scaling);
}

}  // namespace llm
