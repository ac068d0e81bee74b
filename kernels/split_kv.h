// The split-KV (flash-decoding) rule the wave-based planners share (MLA decode, FMHA): a grid
// runs in waves over the GPU's resident CTA slots, and splitting KV into more CTAs pays only while
// it fills those slots better. Host-only; no CUDA headers.
#pragma once

#include <cmath>

namespace llm {

// How busy the resident slots stay over a grid of `waves` waves (slots-worth of CTAs): below one
// wave the share of slots in use; past it, how full the waves are on average (a 1.3-wave grid
// idles most SMs during its tail). The epsilon keeps a sum of per-CTA fractions that lands just
// above a whole number from counting an extra wave.
inline double WaveEfficiency(double waves) {
  return waves <= 1.0 ? waves : waves / std::ceil(waves - 1e-9);
}

// Whether a finer split (its waves, its efficiency) replaces the best one so far. Under one wave
// more CTAs are always better; past it, a split must gain a real share (its partials and the
// merge cost something) to be taken.
inline bool SplitImproves(double waves, double efficiency, double best_efficiency) {
  constexpr double kMinGain = 0.03;
  return waves <= 1.0 ? efficiency > best_efficiency : efficiency > best_efficiency + kMinGain;
}

}  // namespace llm
