// The split-KV (flash-decoding) planner the attention families share (C8, MLA decode, FMHA): a
// grid runs in waves over the GPU's resident CTA slots, and splitting KV into more CTAs pays only
// while it fills those slots better. One search over the candidate chunks (ChooseKvChunk) and the
// two ways of rating a candidate: by how full its waves are (WaveEfficiency / SplitImproves, for
// CTAs of equal cost) or by the launch time of CTAs of unequal cost (WaveTime, C8's fitted
// costs). Host-only; no CUDA headers.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

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

// How long a grid of `ctas` CTAs of unequal cost takes over `slots` resident slots, in the CTAs'
// cost unit: the waves before the last at the average CTA, then the longest one.
inline double WaveTime(int64_t ctas, int64_t slots, double average, double longest) {
  const double waves = std::ceil(static_cast<double>(ctas) / static_cast<double>(slots));
  return (waves - 1) * average + longest;
}

// The chunk that splits max_kv tokens into n pieces, rounded up to 64 tokens (a multiple of the
// page sizes every family's items start on).
inline int64_t KvChunkFor(int64_t max_kv, int n) {
  return ((max_kv + n - 1) / n + 63) / 64 * 64;
}

// How many chunks of `chunk` tokens cover kv_end tokens.
inline int64_t NumKvChunks(int64_t kv_end, int64_t chunk) {
  return (kv_end + chunk - 1) / chunk;
}

// The KV chunk of a step: the longest sequence (max_kv tokens) whole, or split into n = 2 ..
// max_splits pieces (KvChunkFor), tried coarsest first until a chunk would fall below min_chunk
// tokens or `fits(chunk)` says its items pass a grid's capacity (finer chunks only add items).
// `score(chunk)` rates a candidate; `better(score, best)` says whether it replaces the best so far.
template <typename Score, typename Better, typename Fits>
int64_t ChooseKvChunk(int64_t max_kv, int max_splits, int64_t min_chunk, Score score, Better better,
                      Fits fits) {
  int64_t chunk = std::max<int64_t>(max_kv, 1);
  auto best = score(chunk);
  for (int n = 2; n <= max_splits; ++n) {
    const int64_t c = KvChunkFor(max_kv, n);
    if (c < min_chunk || !fits(c)) break;
    const auto s = score(c);
    if (better(s, best)) {
      best = s;
      chunk = c;
    }
  }
  return chunk;
}

}  // namespace llm
