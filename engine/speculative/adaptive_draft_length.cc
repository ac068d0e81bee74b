#include "engine/speculative/adaptive_draft_length.h"

#include <algorithm>
#include <cmath>

namespace llm {

int AdaptiveDraftLength::Next() const {
  const double a = acceptance();
  if (a >= 1.0) return max_drafts_;
  if (a <= 0.0) return 1;
  // The largest j with a^j >= kMinAcceptance.
  const double j = std::floor(std::log(kMinAcceptance) / std::log(a) + 1e-9);
  return static_cast<int>(std::clamp(j, 1.0, static_cast<double>(max_drafts_)));
}

void AdaptiveDraftLength::Observe(int drafted, int accepted) {
  // The accepted drafts, and the first rejected one if any (the ones after it were never tried).
  const double trials = accepted + (accepted < drafted ? 1 : 0);
  accepted_ = (1.0 - kDecay) * accepted_ + kDecay * accepted;
  trials_ = (1.0 - kDecay) * trials_ + kDecay * trials;
}

}  // namespace llm
